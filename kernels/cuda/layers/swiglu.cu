// Launcher of SwiGLU: validates the Params and dispatches the activation
// dtype (three instantiations).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/swiglu.h"
#include "kernels/cuda/layers/swiglu_kernel.cuh"

namespace kvserve::cuda {
namespace {

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("SwiGlu: ", field, " must be ", rule, ", got ", value));
}

}  // namespace

absl::Status SwiGlu(const SwiGluParams& params, cudaStream_t stream) {
  SwiGluParams p = params;
  if (p.hidden <= 0) return Bad("hidden", "> 0", p.hidden);
  if (p.num_tokens < 0) return Bad("num_tokens", ">= 0", p.num_tokens);
  if (p.gate_up_stride == 0) p.gate_up_stride = 2 * p.hidden;
  if (p.out_stride == 0) p.out_stride = p.hidden;
  if (p.gate_up_stride < 2 * p.hidden)
    return Bad("gate_up_stride", ">= 2 * hidden", p.gate_up_stride);
  if (p.out_stride < p.hidden) return Bad("out_stride", ">= hidden", p.out_stride);
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.gate_up == nullptr) return absl::InvalidArgumentError("SwiGlu: gate_up is null");
  if (p.out == nullptr) return absl::InvalidArgumentError("SwiGlu: out is null");
  const dim3 grid(
      static_cast<unsigned>(
          std::min<int64_t>((p.hidden + swiglu_detail::kThreads - 1) / swiglu_detail::kThreads,
                            swiglu_detail::kMaxBlocksX)),
      static_cast<unsigned>(std::min<int64_t>(p.num_tokens, swiglu_detail::kMaxBlocksY)));
  const bool known = DispatchActDtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(swiglu_detail::SwiGluKernel<T>, grid, swiglu_detail::kThreads, 0, stream, p);
  });
  if (!known) return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  return CudaStatus(cudaGetLastError(), "SwiGlu launch");
}

}  // namespace kvserve::cuda
