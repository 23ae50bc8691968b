// kernels/cuda/sampling/: logits to tokens on the device (the per-row sampler
// and its Philox draw) and the structured-output token masks.
//
// Logits processing and sampling on the GPU: one token per logits row, with
// its raw logprob and the top-n alternatives when asked, so only those few
// bytes come back to the host.
//
// Semantics: model/sampling/sampler.h's, per row (SampleRowParams in
// kernels/sample_rows.h; the host packs rows and token histories with
// kernels/plan/sampling_batch.h into one upload). Penalties -> temperature ->
// top-k -> top-p -> min-p -> draw; greedy (temperature 0) returns exactly
// the CPU sampler's token for the same logits (argmax after penalties,
// lowest id on ties, NaN never wins); the processed logits left in
// `processed` equal the CPU's bit for bit (penalties, then the division by
// the temperature and NaN -> -inf unless greedy). Logprobs are raw
// (log_softmax of the logits as passed in, NaN as -inf), within about 1e-12
// relative of the CPU's. Details and the two deliberate differences
// (fixed-point masses; Philox draws) are in sample_row.cuh.
//
// Random draws: row r's draw is Philox4x32-10 keyed by rows[r].seed at
// counter rows[r].step (kernels/cuda/device/philox.cuh), a pure function of the
// two, so a seeded request gets the same tokens whatever it is batched
// with and however often it is preempted and recomputed, as long as the
// caller passes step = the index of the token being sampled (the
// sequence's output length) and gives every sequence its own seed (forked
// n > 1 siblings need distinct seeds). The draws do NOT match the CPU
// sampler's mt19937_64 stream; only greedy matches the CPU exactly.
//
// Cost: one thread block of 512 threads per row, all rows in parallel;
// about 2 passes over the row for greedy, up to about 24 with top-k +
// top-p + min-p + top-n logprobs (radix selects, no sort), each pass
// reading vocab floats of the row's workspace (mostly from L2).
//
// Workspace: processed and counts are [num_rows][vocab] each (fp32 and
// int32). counts must be all zero before the first call (cudaMemsetAsync
// once at allocation); every call leaves it all zero again. Rows must not
// share workspace rows.
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/sample_rows.h"

namespace kvserve::cuda {

struct SampleParams {
  const void* logits = nullptr;  // [num_rows][logits_stride] (dtype), device
  int64_t logits_stride = 0;     // elements; 0: vocab
  ActDtype dtype = ActDtype::kFp32;
  int32_t vocab = 0;  // in [1, kMaxSampleVocab]
  int32_t num_rows = 0;
  const SampleRowParams* rows = nullptr;  // [num_rows], device
  const int32_t* history = nullptr;       // ids the rows' history ranges index, device;
                                          // may be null when no row has a history
  float* processed = nullptr;             // [num_rows][vocab] fp32 workspace, device
  int32_t* counts = nullptr;              // [num_rows][vocab] int32, device, all zero
  SampleRowResult* results = nullptr;     // [num_rows], device
};

// Where processed and counts sit in one allocation for up to max_rows rows
// (each region 256-byte aligned).
struct SampleWorkspaceLayout {
  int64_t processed_offset = 0;
  int64_t counts_offset = 0;
  int64_t bytes = 0;
};
SampleWorkspaceLayout SampleWorkspaceFor(int32_t max_rows, int32_t vocab);

// InvalidArgument naming the field for bad sizes or pointers; otherwise the
// launch's status. num_rows == 0 launches nothing.
absl::Status SampleTokens(const SampleParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
