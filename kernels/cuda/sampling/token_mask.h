// Token masks of constrained decoding on the GPU (SampleRow::allowed,
// scheduler/grammar_state.h): row r of `logits` gets -inf at every id whose
// bit is clear in its mask (bit id % 32 of word id / 32), in place, before
// the sampling kernel runs; the other ids keep their bits. The CPU sampler
// masks after its penalties (model/sampling/sampler.cc Sampler::ApplyMask);
// masking first gives the same draw, since every penalty maps -inf to -inf
// and touches each id alone.
//
// logits: [num_rows][vocab] fp32, device; masks: [num_rows][words] with
// words = (vocab + 31) / 32, device (a row without a constraint has every
// bit set). One launch.
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace kvserve::cuda {

struct TokenMaskParams {
  float* logits = nullptr;          // [num_rows][vocab], device, masked in place
  const uint32_t* masks = nullptr;  // [num_rows][(vocab + 31) / 32], device
  int32_t vocab = 0;
  int32_t num_rows = 0;
};

constexpr int64_t TokenMaskWords(int32_t vocab) { return (int64_t{vocab} + 31) / 32; }

// InvalidArgument naming the field for a bad size or a null pointer;
// num_rows == 0 launches nothing.
absl::Status ApplyTokenMasks(const TokenMaskParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
