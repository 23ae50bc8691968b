// Launcher of CopyBlocks: validates sizes and alignment, then one launch
// over (copies, layers). One instantiation.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/kv/copy_blocks.h"
#include "kernels/cuda/kv/copy_blocks_kernel.cuh"

namespace kvserve::cuda {
namespace {

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("CopyBlocks: ", what));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status CopyBlocks(const CopyBlocksParams& p, cudaStream_t stream) {
  if (p.num_copies < 0) return Bad(absl::StrCat("num_copies must be >= 0, got ", p.num_copies));
  if (p.num_layers <= 0 || p.num_layers > 65535) {
    return Bad(absl::StrCat("num_layers must be in [1, 65535], got ", p.num_layers));
  }
  if (p.block_bytes <= 0 || p.block_bytes % 16 != 0) {
    return Bad(absl::StrCat("block_bytes must be a positive multiple of 16, got ", p.block_bytes));
  }
  if (p.src_num_blocks <= 0) {
    return Bad(absl::StrCat("src_num_blocks must be > 0, got ", p.src_num_blocks));
  }
  if (p.dst_num_blocks <= 0) {
    return Bad(absl::StrCat("dst_num_blocks must be > 0, got ", p.dst_num_blocks));
  }
  if (p.num_copies == 0) return absl::OkStatus();
  if (p.src == nullptr || !Aligned16(p.src)) return Bad("src is null or not 16-byte aligned");
  if (p.dst == nullptr || !Aligned16(p.dst)) return Bad("dst is null or not 16-byte aligned");
  if (p.copies == nullptr || reinterpret_cast<uintptr_t>(p.copies) % 8 != 0) {
    return Bad("copies is null or not 8-byte aligned");
  }
  const dim3 grid(static_cast<unsigned>(p.num_copies), static_cast<unsigned>(p.num_layers));
  LaunchKernel(copy_blocks_detail::CopyBlocksKernel, grid, copy_blocks_detail::kThreads, 0, stream,
               p);
  return CudaStatus(cudaGetLastError(), "CopyBlocks launch");
}

absl::StatusOr<uint8_t*> MappedDevicePointer(void* host) {
  if (host == nullptr) return absl::InvalidArgumentError("MappedDevicePointer: host is null");
  void* device = nullptr;
  const cudaError_t error = cudaHostGetDevicePointer(&device, host, 0);
  if (error != cudaSuccess) {
    cudaGetLastError();  // reset it, or the next launch check would report it
    return absl::InvalidArgumentError(
        absl::StrCat("MappedDevicePointer: host is not pinned, mapped host memory (",
                     cudaGetErrorName(error), ")"));
  }
  return static_cast<uint8_t*>(device);
}

}  // namespace kvserve::cuda
