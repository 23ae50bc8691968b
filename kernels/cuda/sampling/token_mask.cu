// Launcher of ApplyTokenMasks: validates, then one launch over (rows, word
// groups). One instantiation.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/sampling/token_mask.h"
#include "kernels/cuda/sampling/token_mask_kernel.cuh"

namespace kvserve::cuda {

absl::Status ApplyTokenMasks(const TokenMaskParams& p, cudaStream_t stream) {
  if (p.num_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ApplyTokenMasks: num_rows must be >= 0, got ", p.num_rows));
  }
  if (p.vocab <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ApplyTokenMasks: vocab must be > 0, got ", p.vocab));
  }
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.logits == nullptr) return absl::InvalidArgumentError("ApplyTokenMasks: logits is null");
  if (p.masks == nullptr) return absl::InvalidArgumentError("ApplyTokenMasks: masks is null");
  const int64_t words = TokenMaskWords(p.vocab);
  const dim3 grid(static_cast<unsigned>(p.num_rows),
                  static_cast<unsigned>((words + token_mask_detail::kThreads - 1) /
                                        token_mask_detail::kThreads));
  LaunchKernel(token_mask_detail::TokenMaskKernel, grid, token_mask_detail::kThreads, 0, stream, p);
  return CudaStatus(cudaGetLastError(), "ApplyTokenMasks launch");
}

}  // namespace kvserve::cuda
