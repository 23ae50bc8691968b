// Launcher of FillWeights: validates and dispatches the dtype.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/weight_init.h"
#include "kernels/cuda/layers/weight_init_kernel.cuh"

namespace kvserve::cuda {

absl::Status FillWeights(const WeightFillParams& p, cudaStream_t stream) {
  if (p.n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("FillWeights: n must be >= 0, got ", p.n));
  }
  if (p.n == 0) return absl::OkStatus();
  if (p.dst == nullptr) return absl::InvalidArgumentError("FillWeights: dst is null");
  if (p.source == WeightSource::kFp32 && p.src == nullptr) {
    return absl::InvalidArgumentError("FillWeights: src is null");
  }
  if (p.source == WeightSource::kDummy && p.dummy_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FillWeights: dummy_index must be >= 0, got ", p.dummy_index));
  }
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, int64_t{65535} * 8);
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (p.dtype) {
    case ActDtype::kFp32:
      LaunchKernel(weight_init_detail::FillWeightsKernel<float>, grid, kThreads, 0, stream, p);
      break;
    case ActDtype::kFp16:
      LaunchKernel(weight_init_detail::FillWeightsKernel<__half>, grid, kThreads, 0, stream, p);
      break;
    case ActDtype::kBf16:
      LaunchKernel(weight_init_detail::FillWeightsKernel<__nv_bfloat16>, grid, kThreads, 0, stream,
                   p);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "FillWeights: dtype must be fp32, fp16 or bf16, got ", static_cast<int>(p.dtype)));
  }
  return CudaStatus(cudaGetLastError(), "FillWeights launch");
}

}  // namespace kvserve::cuda
