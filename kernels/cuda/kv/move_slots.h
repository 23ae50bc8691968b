// KV eviction's slot moves on the GPU (cache/block_copy.h SlotMove,
// StepCopies::slot_moves): each move copies one token's K and V rows and
// their per-token scales from flat slot src to flat slot dst of the device
// pool, in every layer and every kv head, exactly the bytes the CPU runner's
// MoveSlots copies (model/cpu/cpu_model_runner.cc); nothing else of either block
// changes. One launch for the whole list.
//
// Pool: [num_layers][num_blocks][layout.block_bytes] (cache/format/kv_pages.h).
// Move list on the device: moves[2 * i] = src, moves[2 * i + 1] = dst, two
// int64 per move, i.e. the bytes of a host std::vector<SlotMove> uploaded as
// is (MoveListBytes(n)). Moves must be independent (no slot is the
// destination of one move and the source or destination of another), as
// eviction's refills are; a move naming a slot outside the pool is skipped.
// Per-token formats only: a layout with tails or per-channel meta (int4_kc)
// is refused.
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/paged_view.h"

namespace kvserve::cuda {

struct MoveSlotsParams {
  uint8_t* pool = nullptr;  // [num_layers][num_blocks][layout.block_bytes], device
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  KvPageLayout layout;
  const int64_t* moves = nullptr;  // [num_moves][2] {src, dst}, device
  int32_t num_moves = 0;
};

constexpr int64_t MoveListBytes(int64_t num_moves) {
  return num_moves * 2 * static_cast<int64_t>(sizeof(int64_t));
}

// InvalidArgument naming the field for bad sizes, null pointers or an
// int4_kc layout; otherwise the launch's status. num_moves == 0 launches
// nothing.
absl::Status MoveSlots(const MoveSlotsParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
