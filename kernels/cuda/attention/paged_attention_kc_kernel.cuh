// Device code of int4_kc and int2_kc paged attention (see paged_attention_kc.h
// for the contract); the code bits (4 or 2) are the layout's, a runtime value
// (one kernel for both). The structure is attention_skeleton.cuh's, which
// paged_attention_kernel.cuh's per-token kernel shares (work items of
// gpu_attention_plan.h, tiles of kTileKeys keys decoded to shared memory,
// online softmax, register accumulators, split-KV partials and a merge);
// it is a separate kernel so that the plain formats' kernel stays one
// template over (K, V) element types.
//
// What differs: a key is read quantized by rows of later blocks and in full
// precision by rows of its own block. Tiles are cut at block boundaries;
// a tile of block kb is processed in up to two passes, each decoding the
// tile one way and masking the rows that must not see it that way:
//   quantized pass  (kb < the item's last row's block): rows with kb < i / bs;
//   full pass       (kb >= the item's first row's block): rows with kb == i / bs
//                   (keys from the tail below `first`, from new_k/new_v above).
// Both passes feed the same online softmax, which does not depend on the
// order keys arrive in. An item's rows span at most two blocks (at most 16
// rows, block_size >= 16), so only one block per item takes both passes.
//
// Grid: (num_items, num_heads / hpc); block: 128 threads; dynamic shared
// memory SmemFloats(head_dim) floats (the skeleton's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_skeleton.cuh"
#include "kernels/cuda/attention/paged_attention_kc.h"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/device/kv_decode.cuh"
#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve::cuda::attention_kc_detail {

using attention_common::LoadAct;
using attention_common::PlanHeader;

using attention_skeleton::kThreads;
using attention_skeleton::kTileKeys;
using attention_skeleton::SmemFloats;

// The skeleton's fields, then this step's K/V rows.
struct KernelArgs : attention_skeleton::AttentionArgs {
  const void* new_k;  // [num_tokens][new_k_stride] of dtype
  const void* new_v;
  int64_t new_k_stride;
  int64_t new_v_stride;
};

// Codes of channels 2i, 2i + 1 of a row of `bits`-bit codes (4: byte i; 2:
// the half of byte i / 2 that holds them), low channel in .x.
__device__ __forceinline__ uint2 CodePair(const uint8_t* row, int i, int bits) {
  if (bits == 4) {
    const uint32_t b = row[i];
    return make_uint2(b & 0xfu, b >> 4);
  }
  const uint32_t b = static_cast<uint32_t>(row[i / 2]) >> (4 * (i % 2));
  return make_uint2(b & 0x3u, (b >> 2) & 0x3u);
}

// Channels 2i, 2i + 1 of an int4_kc / int2_kc K row: codes in `row`, the
// head's block meta in `meta`; exactly cpu::DequantizeRow's values.
__device__ __forceinline__ float2 DecodeChannelPair(const uint8_t* row, const uint8_t* meta, int i,
                                                    int bits) {
  using namespace exact;
  float lo, unit;
  std::memcpy(&lo, meta, 4);
  std::memcpy(&unit, meta + 4, 4);
  const uint8_t* c = meta + kInt4ChannelHeader + 4 * i;  // cmin, cmax of 2i, then of 2i + 1
  const uint2 q = CodePair(row, i, bits);
  const int levels = KvCodeLevels(bits);
  float out[2];
  for (int k = 0; k < 2; ++k) {
    const int cmin = c[2 * k], cmax = c[2 * k + 1];
    const float scale = Mul(static_cast<float>(cmax - cmin), unit);
    const float zero = Fma(static_cast<float>(levels * cmin), unit, lo);
    out[k] = Fma(static_cast<float>(k == 0 ? q.x : q.y), scale, zero);
  }
  return make_float2(out[0], out[1]);
}

// Channels 2i, 2i + 1 of a V row of `bits`-bit codes, per-token groups of
// group_size (exactly cpu::DequantizeRow's q * scale + zero, unfused).
__device__ __forceinline__ float2 DecodeVPair(const uint8_t* row, const uint8_t* meta, int i,
                                              int group_size, int bits) {
  if (bits == 4) return kv_decode::DecodePair<KvElem::kInt4>(row, meta, i, group_size);
  const float2 sz = kv_decode::Int4ScaleZero(meta, 2 * i, group_size);
  const uint2 q = CodePair(row, i, bits);
  return make_float2(__fadd_rn(__fmul_rn(static_cast<float>(q.x), sz.x), sz.y),
                     __fadd_rn(__fmul_rn(static_cast<float>(q.y), sz.x), sz.y));
}

__device__ __forceinline__ float RoundToFp16(float x) {
  using namespace kv_encode;
  return Fp16ToFloat(FloatToFp16(Saturate(x, kFp16Max)));
}

__global__ void __launch_bounds__(kThreads)
    AttentionKcKernel(const __grid_constant__ KernelArgs a) {
  const GpuAttentionPlanHeader& header = PlanHeader(a.plan);
  if (static_cast<int32_t>(blockIdx.x) >= header.num_items) return;
  const GpuAttentionWorkItem item =
      reinterpret_cast<const GpuAttentionWorkItem*>(a.plan + header.items_offset)[blockIdx.x];

  const KvPageLayout& layout = a.kv.layout;
  const int bs = layout.block_size;
  attention_skeleton::Item it(a, item);
  const int kv_head = it.kv_head, hd = it.hd, pairs = it.pairs;
  const int32_t first_index = it.first_index;
  const int32_t last_index = first_index + item.num_rows - 1;
  const int32_t* table = a.batch.BlockRow(item.seq);
  const int32_t seq_first = a.batch.FirstIndex(item.seq);
  const int32_t seq_row0 = a.batch.query_start[item.seq];
  const int32_t tail_id = a.batch.tail_ids != nullptr ? a.batch.tail_ids[item.seq] : -1;
  const uint8_t* tail = tail_id >= 0 ? a.kv.Tail(tail_id) : nullptr;
  float2 acc[attention_skeleton::kSlots];
  it.Start(a, acc);

  for (int32_t t0 = item.key_begin; t0 < item.key_end;) {
    const int32_t kb = t0 / bs;
    const int n = min(min(kTileKeys, item.key_end - t0), (kb + 1) * bs - t0);
    const bool need_quant = kb < last_index / bs;
    const bool need_full = kb >= first_index / bs;
    for (int pass = 0; pass < 2; ++pass) {
      const bool full = pass == 1;
      if (full ? !need_full : !need_quant) continue;  // uniform over the CTA
      // Keys t0 .. t0 + n - 1 decoded one way: quantized from block kb, or
      // in full precision from the tail or this step's rows.
      const auto decode = [&](int32_t key, int i, float2& kf, float2& vf) {
        const int slot = key % bs;
        if (!full) {
          const uint8_t* block = a.kv.Block(table[kb]);
          kf = DecodeChannelPair(block + layout.RowOffset(layout.k, kv_head, slot),
                                 block + layout.BlockMetaOffset(layout.k, kv_head), i,
                                 layout.k.bits);
          vf = DecodeVPair(block + layout.RowOffset(layout.v, kv_head, slot),
                           block + layout.MetaOffset(layout.v, kv_head, slot), i,
                           layout.v.group_size, layout.v.bits);
        } else if (key < seq_first) {
          if (tail != nullptr) {
            kf = kv_decode::DecodePair<KvElem::kFp16>(
                tail + layout.TailRowOffset(false, kv_head, slot), nullptr, i, 0);
            vf = kv_decode::DecodePair<KvElem::kFp16>(
                tail + layout.TailRowOffset(true, kv_head, slot), nullptr, i, 0);
          } else {
            kf = vf = make_float2(0.0f, 0.0f);  // broken batch: no tail
          }
        } else {
          const int64_t row = seq_row0 + (key - seq_first);
          const int64_t kc = row * a.new_k_stride + int64_t(kv_head) * hd + 2 * i;
          const int64_t vc = row * a.new_v_stride + int64_t(kv_head) * hd + 2 * i;
          kf = make_float2(RoundToFp16(LoadAct(a.new_k, a.dtype, kc)),
                           RoundToFp16(LoadAct(a.new_k, a.dtype, kc + 1)));
          vf = make_float2(RoundToFp16(LoadAct(a.new_v, a.dtype, vc)),
                           RoundToFp16(LoadAct(a.new_v, a.dtype, vc + 1)));
        }
      };
      // Row i sees this pass when kb is its own block exactly in the full pass.
      const auto this_pass = [&](int32_t index) { return (kb == index / bs) == full; };
      const auto dot = [&](int, int32_t, const float2* q2, const float2* k2) {
        return attention_skeleton::QueryDot(q2, k2, pairs);
      };
      it.Pass(a, t0, n, decode, this_pass, dot, acc);
    }
    t0 += n;
  }
  it.Finish(a, nullptr, acc);
}

// Combines the partitions of split rows (the skeleton's MergeRows; int4_kc
// records no softmax statistics).
__global__ void __launch_bounds__(kThreads) MergeKcKernel(const __grid_constant__ KernelArgs a) {
  attention_skeleton::MergeRows(a, nullptr);
}

}  // namespace kvserve::cuda::attention_kc_detail
