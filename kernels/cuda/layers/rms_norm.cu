// Launcher of RMSNorm: validates the Params, decides whether 16-byte vector
// access is safe, picks the block size and dispatches the runtime dtype and
// fused flag to the six template instantiations.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/rms_norm.h"
#include "kernels/cuda/layers/rms_norm_kernel.cuh"

namespace kvserve::cuda {
namespace {

using rms_norm_detail::RmsNormKernel;

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("RmsNorm: ", field, " must be ", rule, ", got ", value));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
void Launch(const RmsNormParams& p, bool fused, bool vectorized, int threads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.heads > 0 ? p.num_tokens * p.heads : p.num_tokens));
  if (fused) {
    LaunchKernel(RmsNormKernel<T, true>, grid, threads, 0, stream, p, vectorized);
  } else {
    LaunchKernel(RmsNormKernel<T, false>, grid, threads, 0, stream, p, vectorized);
  }
}

}  // namespace

absl::Status RmsNorm(const RmsNormParams& params, cudaStream_t stream) {
  RmsNormParams p = params;
  if (p.x_stride == 0) p.x_stride = p.dim;
  if (p.residual_stride == 0) p.residual_stride = p.dim;
  if (p.out_stride == 0) p.out_stride = p.dim;
  const bool fused = p.residual != nullptr;

  if (p.dim <= 0) return Bad("dim", "> 0", p.dim);
  if (p.num_tokens < 0 || p.num_tokens > std::numeric_limits<int32_t>::max()) {
    return Bad("num_tokens", "in [0, 2^31)", p.num_tokens);
  }
  if (p.heads < 0) return Bad("heads", ">= 0", p.heads);
  if (p.heads > 0 && fused) {
    return absl::InvalidArgumentError("RmsNorm: the per-head form (heads > 0) takes no residual");
  }
  const int64_t span = p.heads > 0 ? p.heads * p.dim : p.dim;  // elements a row covers
  if (p.heads > 0 && p.num_tokens * p.heads > std::numeric_limits<int32_t>::max()) {
    return Bad("num_tokens * heads", "below 2^31", p.num_tokens * p.heads);
  }
  if (p.x_stride < span) return Bad("x_stride", ">= dim (heads * dim per head)", p.x_stride);
  if (p.out_stride < span) return Bad("out_stride", ">= dim (heads * dim per head)", p.out_stride);
  if (fused && p.residual_stride < p.dim) {
    return Bad("residual_stride", ">= dim", p.residual_stride);
  }
  if (!(p.eps > 0.0f)) return absl::InvalidArgumentError("RmsNorm: eps must be > 0");
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.x == nullptr) return absl::InvalidArgumentError("RmsNorm: x is null");
  if (p.weight == nullptr) return absl::InvalidArgumentError("RmsNorm: weight is null");
  if (p.out == nullptr) return absl::InvalidArgumentError("RmsNorm: out is null");
  if (fused && p.out == p.x) {
    return absl::InvalidArgumentError("RmsNorm: out must not alias x when residual is set");
  }

  const int64_t width = 16 / ActDtypeSize(p.dtype);
  bool vectorized = p.dim % width == 0 && p.x_stride % width == 0 && p.out_stride % width == 0 &&
                    Aligned16(p.x) && Aligned16(p.out) && Aligned16(p.weight) &&
                    (p.weight2 == nullptr || Aligned16(p.weight2));
  if (fused) {
    vectorized = vectorized && p.residual_stride % width == 0 && Aligned16(p.residual);
  }
  // One thread per element (or vector) up to 1024; longer rows loop.
  const int64_t units = vectorized ? p.dim / width : p.dim;
  const int threads = static_cast<int>(std::clamp<int64_t>((units + 31) / 32 * 32, 32, 1024));

  switch (p.dtype) {
    case ActDtype::kFp32:
      Launch<float>(p, fused, vectorized, threads, stream);
      break;
    case ActDtype::kFp16:
      Launch<__half>(p, fused, vectorized, threads, stream);
      break;
    case ActDtype::kBf16:
      Launch<__nv_bfloat16>(p, fused, vectorized, threads, stream);
      break;
    default:
      return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  }
  return CudaStatus(cudaGetLastError(), "RmsNorm launch");
}

}  // namespace kvserve::cuda
