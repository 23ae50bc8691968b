// Launcher of QuantizeRowsFp8: validates the Params, picks the block size
// and dispatches the runtime dtype to the two instantiations (bf16, fp16).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/fp8_rows.h"
#include "kernels/cuda/layers/fp8_rows_kernel.cuh"

namespace kvserve::cuda {
namespace {

using fp8_rows_detail::QuantizeRowsFp8Kernel;

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("QuantizeRowsFp8: ", field, " must be ", rule, ", got ", value));
}

}  // namespace

absl::Status QuantizeRowsFp8(const Fp8RowsParams& params, cudaStream_t stream) {
  Fp8RowsParams p = params;
  if (p.ldx == 0) p.ldx = p.cols;
  if (p.ldq == 0) p.ldq = (p.cols + 15) / 16 * 16;
  if (p.cols <= 0) return Bad("cols", "> 0", p.cols);
  if (p.rows < 0 || p.rows > std::numeric_limits<int32_t>::max()) {
    return Bad("rows", "in [0, 2^31)", p.rows);
  }
  if (p.ldx < p.cols) return Bad("ldx", ">= cols", p.ldx);
  if (p.ldq < p.cols) return Bad("ldq", ">= cols", p.ldq);
  if (p.dtype != ActDtype::kBf16 && p.dtype != ActDtype::kFp16) {
    return Bad("dtype", "bf16 or fp16", static_cast<int64_t>(p.dtype));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (p.x == nullptr) return absl::InvalidArgumentError("QuantizeRowsFp8: x is null");
  if (p.q == nullptr) return absl::InvalidArgumentError("QuantizeRowsFp8: q is null");
  if (p.scale == nullptr) return absl::InvalidArgumentError("QuantizeRowsFp8: scale is null");
  // One thread per element up to 1024; longer rows loop.
  const int threads = static_cast<int>(std::clamp<int64_t>((p.ldq + 31) / 32 * 32, 32, 1024));
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (p.dtype == ActDtype::kBf16) {
    LaunchKernel(QuantizeRowsFp8Kernel<__nv_bfloat16>, grid, threads, 0, stream, p);
  } else {
    LaunchKernel(QuantizeRowsFp8Kernel<__half>, grid, threads, 0, stream, p);
  }
  return CudaStatus(cudaGetLastError(), "QuantizeRowsFp8 launch");
}

}  // namespace kvserve::cuda
