// Embedding lookup on the GPU: out[t] = table[ids[t]], rows of `dim`
// activations copied verbatim (no arithmetic, so it equals cpu::Embedding
// exactly for any dtype).
//
// ids are the device BatchView's token_ids. The runner checks them against
// the vocabulary on the host; a token id outside [0, vocab) gets a row of
// NaN instead of an out-of-bounds read.
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

struct EmbeddingParams {
  const void* table = nullptr;   // [vocab][dim] (ActDtype), device
  const int32_t* ids = nullptr;  // [num_tokens], device
  void* out = nullptr;           // [num_tokens][out_stride] (ActDtype), device
  int64_t vocab = 0;
  int64_t dim = 0;
  int64_t num_tokens = 0;
  int64_t out_stride = 0;  // elements; 0: dim
  ActDtype dtype = ActDtype::kFp32;
};

// InvalidArgument naming the field for bad sizes or pointers; otherwise the
// launch's status. num_tokens == 0 launches nothing.
absl::Status Embedding(const EmbeddingParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
