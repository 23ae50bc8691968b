// Device code of MoveSlots (see move_slots.h for the contract).
//
// Algorithm: one thread block per (move, layer); for each kv head and part
// (K, then V) the threads copy the token's row bytes and then its meta bytes,
// byte by byte (rows are small: head_dim / 2 to 4 * head_dim bytes, not
// always 4-byte aligned for int4 with odd head_dim / 2).
//
// Grid: (num_moves, num_layers). Block: (kThreads).
#pragma once

#include <cstdint>

#include "kernels/cuda/kv/move_slots.h"

namespace kvserve::cuda::move_slots_detail {

inline constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) MoveSlotsKernel(const MoveSlotsParams p) {
  const int64_t src = p.moves[2 * blockIdx.x], dst = p.moves[2 * blockIdx.x + 1];
  const KvPageLayout& lay = p.layout;
  const int64_t num_slots = int64_t{p.num_blocks} * lay.block_size;
  if (src < 0 || src >= num_slots || dst < 0 || dst >= num_slots) return;
  const int64_t layer = blockIdx.y;
  uint8_t* layer_base = p.pool + layer * p.num_blocks * lay.block_bytes;
  const uint8_t* sblock = layer_base + (src / lay.block_size) * lay.block_bytes;
  uint8_t* dblock = layer_base + (dst / lay.block_size) * lay.block_bytes;
  const int so = static_cast<int>(src % lay.block_size);
  const int dof = static_cast<int>(dst % lay.block_size);
  for (int h = 0; h < lay.num_kv_heads; ++h) {
    for (int part_index = 0; part_index < 2; ++part_index) {
      const KvPartLayout& part = part_index == 0 ? lay.k : lay.v;
      const uint8_t* sr = sblock + lay.RowOffset(part, h, so);
      uint8_t* dr = dblock + lay.RowOffset(part, h, dof);
      for (int i = static_cast<int>(threadIdx.x); i < part.row_bytes; i += kThreads) dr[i] = sr[i];
      const uint8_t* sm = sblock + lay.MetaOffset(part, h, so);
      uint8_t* dm = dblock + lay.MetaOffset(part, h, dof);
      for (int i = static_cast<int>(threadIdx.x); i < part.meta_bytes; i += kThreads) dm[i] = sm[i];
    }
  }
}

}  // namespace kvserve::cuda::move_slots_detail
