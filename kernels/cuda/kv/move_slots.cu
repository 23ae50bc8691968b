// Launcher of MoveSlots: validates sizes, then one launch over (moves,
// layers). One instantiation.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/kv/move_slots.h"
#include "kernels/cuda/kv/move_slots_kernel.cuh"

namespace kvserve::cuda {
namespace {

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("MoveSlots: ", field, " must be ", rule, ", got ", value));
}

}  // namespace

absl::Status MoveSlots(const MoveSlotsParams& p, cudaStream_t stream) {
  if (p.num_moves < 0) return Bad("num_moves", ">= 0", p.num_moves);
  if (p.num_layers <= 0 || p.num_layers > 65535) {
    return Bad("num_layers", "in [1, 65535]", p.num_layers);
  }
  if (p.num_blocks <= 0) return Bad("num_blocks", "> 0", p.num_blocks);
  if (p.layout.block_size <= 0) return Bad("layout.block_size", "> 0", p.layout.block_size);
  if (p.layout.has_tails() || p.layout.k.elem == KvElem::kInt4Channel ||
      p.layout.v.elem == KvElem::kInt4Channel) {
    return absl::InvalidArgumentError(
        "MoveSlots: layout must be a per-token format (int4_kc has no slot moves)");
  }
  if (p.num_moves == 0) return absl::OkStatus();
  if (p.pool == nullptr) return absl::InvalidArgumentError("MoveSlots: pool is null");
  if (p.moves == nullptr) return absl::InvalidArgumentError("MoveSlots: moves is null");
  const dim3 grid(static_cast<unsigned>(p.num_moves), static_cast<unsigned>(p.num_layers));
  LaunchKernel(move_slots_detail::MoveSlotsKernel, grid, move_slots_detail::kThreads, 0, stream, p);
  return CudaStatus(cudaGetLastError(), "MoveSlots launch");
}

}  // namespace kvserve::cuda
