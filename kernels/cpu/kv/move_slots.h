// Slot moves within a host KV pool on the CPU, the pair of
// kernels/cuda/kv/move_slots.h: eviction's compaction copies one token's K
// and V rows and their meta from slot src to slot dst in every layer
// (global slots: block * block_size + offset), nothing else of either block.
// Only for layouts without tails; the caller checks the moves
// (model/batch_check.h CheckSlotMoves).
//
// Thread-safety: none; the caller owns the pool for the call.
#pragma once

#include <span>

#include "cache/block_copy.h"
#include "cache/format/kv_pages.h"

namespace kvserve::cpu {

void MoveSlots(HostKvPages& pages, std::span<const SlotMove> moves);

}  // namespace kvserve::cpu
