// Device code of the KV write (see kv_write.h for the contract).
//
// Algorithm: one warp per (token, part, kv head) row, where part is K or V.
// The warp widens the row's head_dim activations to fp32 in its own slice of
// shared memory, then encodes it with kv_encode::EncodeRow<WarpTeam> straight
// into the page (data row, then meta). Rows are independent: no block-level
// barrier, so a warp whose row is skipped simply returns.
//
// Grid: (ceil(num_tokens * num_kv_heads * 2 / kWarps)). Block: (kWarps * 32).
// Shared memory: kWarps * 2 * kMaxHeadDim floats (16 KiB: row + scratch).
#pragma once

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/cuda/kv/kv_write.h"

namespace kvserve::cuda::kv_write_detail {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;

template <typename T>
__global__ void __launch_bounds__(kThreads) KvWriteKernel(const KvWriteParams p) {
  __shared__ float smem[kWarps * 2 * kv_encode::kMaxHeadDim];
  const KvPageLayout& layout = p.kv.layout;
  const int hd = layout.head_dim, hkv = layout.num_kv_heads, bs = layout.block_size;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= static_cast<int64_t>(p.num_tokens) * hkv * 2) return;
  const int64_t t = item / (2 * hkv);
  const int part_index = static_cast<int>(item % (2 * hkv)) / hkv;  // 0: K, 1: V
  const int h = static_cast<int>(item % hkv);
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= static_cast<int64_t>(p.kv.num_blocks) * bs) return;

  const kv_encode::WarpTeam team;
  float* x = smem + warp * 2 * kv_encode::kMaxHeadDim;
  float* scratch = x + hd;
  const T* src = part_index == 0
                     ? static_cast<const T*>(p.k) + t * p.k_stride + static_cast<int64_t>(h) * hd
                     : static_cast<const T*>(p.v) + t * p.v_stride + static_cast<int64_t>(h) * hd;
  team.For(hd, [&](int i) { x[i] = ToFloat(src[i]); });
  team.Sync();

  const KvPartLayout& part = part_index == 0 ? layout.k : layout.v;
  uint8_t* block = p.kv.BlockOfSlot(slot);
  const int off = static_cast<int>(slot % bs);
  kv_encode::EncodeRow(team, part, hd, x, scratch, block + layout.RowOffset(part, h, off),
                       block + layout.MetaOffset(part, h, off));
}

}  // namespace kvserve::cuda::kv_write_detail
