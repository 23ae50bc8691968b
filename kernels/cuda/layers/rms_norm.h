// RMSNorm on the GPU over rows of activations, optionally fused with the
// residual add that precedes it in every Llama block (vLLM's
// fused_add_rms_norm):
//   plain:  out[t] = x[t] / rms(x[t]) * weight
//   fused:  x[t] += residual[t];  out[t] = x[t] / rms(x[t]) * weight
// with rms(v) = sqrt(mean(v^2) + eps).
//
// x, residual, weight and out share one storage dtype (fp32, fp16 or bf16);
// all arithmetic is fp32 and each output element is rounded once. In the
// fused form the sum is rounded to the storage dtype and stored, and the norm
// is taken of that rounded value, so `out` is exactly the norm of what the
// next residual add will read.
//
// Per-head form (heads > 0, not fused): each of the num_tokens rows holds
// `heads` consecutive sub-rows of dim values (head h at row * x_stride +
// h * dim, likewise in out), each normalised on its own, heads below
// weight2_from with weight and the others with weight2 (Qwen3's q_norm over
// the q heads and k_norm over the k heads of a fused QKV row: one launch for
// every head of every token).
//
// Aliasing: out may equal residual (vLLM's in-place form) or, when not fused,
// x. In the fused form out must not equal x.
//
// Thread-safety: stateless; the work is enqueued on the given stream and
// the call does not synchronise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

struct RmsNormParams {
  void* x = nullptr;               // [num_tokens][x_stride]; fused: becomes x + residual
  const void* residual = nullptr;  // [num_tokens][residual_stride]; null: plain RMSNorm
  const void* weight = nullptr;    // [dim]
  void* out = nullptr;             // [num_tokens][out_stride]
  int64_t num_tokens = 0;
  int64_t dim = 0;
  // Elements from one row to the next; 0 means dim (contiguous rows).
  int64_t x_stride = 0;
  int64_t residual_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-5f;
  ActDtype dtype = ActDtype::kFp32;
  // Per-head form (see above); 0: one row of dim values per token.
  int64_t heads = 0;
  const void* weight2 = nullptr;  // [dim], for heads >= weight2_from; null: weight
  int64_t weight2_from = 0;
};

// InvalidArgument naming the field for a bad shape, stride, pointer or eps;
// otherwise the launch's status. num_tokens == 0 launches nothing.
absl::Status RmsNorm(const RmsNormParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
