// Device code of int4_kc and int2_kc paged attention (see paged_attention_kc.h
// for the contract); the code bits (4 or 2) are the layout's, a runtime value
// (one kernel for both). The structure is paged_attention_kernel.cuh's (work items of
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
// memory SmemFloats(head_dim) floats, laid out as the plain kernel's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/paged_attention_kc.h"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/device/kv_decode.cuh"
#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve::cuda::attention_kc_detail {

using attention_common::LoadAct;
using attention_common::PlanHeader;
using attention_common::StoreAct;
using attention_common::WarpMax;
using attention_common::WarpSum;

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kMaxQ = kGpuAttentionMaxQueryVectors;  // 16
inline constexpr int kTileKeys = 32;
inline constexpr int kMaxPairs = kGpuAttentionMaxHeadDim / 2;
inline constexpr int kSlots = kMaxQ * kMaxPairs / kThreads;
static_assert(kMaxQ * kMaxPairs % kThreads == 0);

__host__ __device__ constexpr int SmemLd(int head_dim) { return ((head_dim / 2) | 1) * 2; }

__host__ __device__ constexpr int SmemFloats(int head_dim) {
  return (kMaxQ + 2 * kTileKeys) * SmemLd(head_dim) + kMaxQ * kTileKeys + 3 * kMaxQ;
}

struct KernelArgs {
  const void* q;
  void* out;
  int64_t q_stride;
  int64_t out_stride;
  ActDtype dtype;
  PagedKvView kv;
  BatchView batch;
  int32_t num_heads;
  int32_t group;
  int32_t heads_per_cta;
  float scale;
  int32_t sliding_window;
  const int32_t* plan;
  float* workspace;
  int64_t slot_floats;
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
  const int hd = layout.head_dim;
  const int pairs = hd / 2;
  const int ld = SmemLd(hd);
  const int bs = layout.block_size;
  const int hpc = a.heads_per_cta;
  const int head0 = static_cast<int>(blockIdx.y) * hpc;
  const int kv_head = head0 / a.group;
  const int nq = item.num_rows * hpc;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int32_t first_index = a.batch.CacheIndex(item.seq, item.row_begin);
  const int32_t last_index = first_index + item.num_rows - 1;
  const int32_t* table = a.batch.BlockRow(item.seq);
  const int32_t seq_first = a.batch.FirstIndex(item.seq);
  const int32_t seq_row0 = a.batch.query_start[item.seq];
  const int32_t tail_id = a.batch.tail_ids != nullptr ? a.batch.tail_ids[item.seq] : -1;
  const uint8_t* tail = tail_id >= 0 ? a.kv.Tail(tail_id) : nullptr;

#if defined(CUDA_SIM_DYNAMIC_SHARED)
  float* q_s = static_cast<float*>(::cuda_sim::g_dynamic_shared);
#else
  extern __shared__ float4 kc_smem4[];
  float* q_s = reinterpret_cast<float*>(kc_smem4);
#endif
  float* k_s = q_s + kMaxQ * ld;
  float* v_s = k_s + kTileKeys * ld;
  float* p_s = v_s + kTileKeys * ld;
  float* max_s = p_s + kMaxQ * kTileKeys;
  float* sum_s = max_s + kMaxQ;
  float* alpha_s = sum_s + kMaxQ;

  for (int e = tid; e < nq * hd; e += kThreads) {
    const int m = e / hd, c = e % hd;
    const int64_t row = item.row_begin + m / hpc;
    const int head = head0 + m % hpc;
    q_s[m * ld + c] = LoadAct(a.q, a.dtype, row * a.q_stride + int64_t(head) * hd + c);
  }
  if (tid < kMaxQ) {
    max_s[tid] = -INFINITY;
    sum_s[tid] = 0.0f;
  }

  float2 acc[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) acc[i] = make_float2(0.0f, 0.0f);

  for (int32_t t0 = item.key_begin; t0 < item.key_end;) {
    const int32_t kb = t0 / bs;
    const int n = min(min(kTileKeys, item.key_end - t0), (kb + 1) * bs - t0);
    const bool need_quant = kb < last_index / bs;
    const bool need_full = kb >= first_index / bs;
    for (int pass = 0; pass < 2; ++pass) {
      const bool full = pass == 1;
      if (full ? !need_full : !need_quant) continue;  // uniform over the CTA
      __syncthreads();  // the previous tile is consumed (first pass: q and state are set)

      // 1. Decode K and V of keys t0 .. t0 + n - 1, one way.
      for (int e = tid; e < n * pairs; e += kThreads) {
        const int j = e / pairs, i = e % pairs;
        const int32_t key = t0 + j;
        const int slot = key % bs;
        float2 kf, vf;
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
        reinterpret_cast<float2*>(k_s + j * ld)[i] = kf;
        reinterpret_cast<float2*>(v_s + j * ld)[i] = vf;
      }
      __syncthreads();

      // 2. Scores, masked to each row's [KeyBegin(i), i] and to this pass.
      for (int e = tid; e < nq * kTileKeys; e += kThreads) {
        const int m = e / kTileKeys, j = e % kTileKeys;
        const int32_t index = first_index + m / hpc;
        const int32_t key = t0 + j;
        float s = -INFINITY;
        if (j < n && key <= index && key >= KeyBegin(index, a.sliding_window) &&
            (kb == index / bs) == full) {
          const float2* q2 = reinterpret_cast<const float2*>(q_s + m * ld);
          const float2* k2 = reinterpret_cast<const float2*>(k_s + j * ld);
          float dot = 0.0f;
          for (int i = 0; i < pairs; ++i) {
            const float2 x = q2[i], y = k2[i];
            dot += x.x * y.x;
            dot += x.y * y.y;
          }
          s = dot * a.scale;
        }
        p_s[m * kTileKeys + j] = s;
      }
      __syncthreads();

      // 3. Online softmax, one warp per query vector, one key per lane.
      for (int m = warp; m < nq; m += kWarps) {
        const float s = p_s[m * kTileKeys + lane];
        const float old_max = max_s[m];
        const float new_max = fmaxf(old_max, WarpMax(s));
        float p = 0.0f, alpha = 1.0f;
        if (new_max != -INFINITY) {
          p = expf(s - new_max);
          alpha = expf(old_max - new_max);
        }
        const float tile_sum = WarpSum(p);
        p_s[m * kTileKeys + lane] = p;
        if (lane == 0) {
          max_s[m] = new_max;
          sum_s[m] = sum_s[m] * alpha + tile_sum;
          alpha_s[m] = alpha;
        }
      }
      __syncthreads();

      // 4. acc = acc * alpha + P V over the tile.
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int e = tid + s * kThreads;
        if (e >= nq * pairs) break;
        const int m = e / pairs, i = e % pairs;
        const float alpha = alpha_s[m];
        float2 r = make_float2(acc[s].x * alpha, acc[s].y * alpha);
        const float* p_row = p_s + m * kTileKeys;
        for (int j = 0; j < n; ++j) {
          const float p = p_row[j];
          const float2 v = reinterpret_cast<const float2*>(v_s + j * ld)[i];
          r.x += p * v.x;
          r.y += p * v.y;
        }
        acc[s] = r;
      }
    }
    t0 += n;
  }

  if (item.partial < 0) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = tid + s * kThreads;
      if (e >= nq * pairs) break;
      const int m = e / pairs, i = e % pairs;
      const int64_t row = item.row_begin + m / hpc;
      const int head = head0 + m % hpc;
      const float inv = 1.0f / sum_s[m];
      const int64_t o = row * a.out_stride + int64_t(head) * hd + 2 * i;
      StoreAct(a.out, a.dtype, o, acc[s].x * inv);
      StoreAct(a.out, a.dtype, o + 1, acc[s].y * inv);
    }
    return;
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = tid + s * kThreads;
    if (e >= nq * pairs) break;
    const int m = e / pairs, i = e % pairs;
    float* slot = a.workspace + (item.partial + m / hpc) * a.slot_floats;
    const int head = head0 + m % hpc;
    reinterpret_cast<float2*>(slot + 2 * a.num_heads + int64_t(head) * hd)[i] = acc[s];
  }
  if (tid < nq) {
    float* slot = a.workspace + (item.partial + tid / hpc) * a.slot_floats;
    const int head = head0 + tid % hpc;
    slot[2 * head] = max_s[tid];
    slot[2 * head + 1] = sum_s[tid];
  }
}

// Combines the partitions of split rows, as paged_attention_kernel.cuh's.
__global__ void __launch_bounds__(kThreads) MergeKcKernel(const __grid_constant__ KernelArgs a) {
  const GpuAttentionPlanHeader& header = PlanHeader(a.plan);
  if (static_cast<int32_t>(blockIdx.x) >= header.num_merges) return;
  const GpuAttentionMergeItem merge =
      reinterpret_cast<const GpuAttentionMergeItem*>(a.plan + header.merges_offset)[blockIdx.x];
  const int hd = a.kv.layout.head_dim;
  for (int e = static_cast<int>(threadIdx.x); e < a.num_heads * hd; e += kThreads) {
    const int head = e / hd, c = e % hd;
    float max_all = -INFINITY;
    for (int p = 0; p < merge.num_partials; ++p) {
      const float* slot =
          a.workspace + int64_t(merge.first_partial + p * merge.stride) * a.slot_floats;
      max_all = fmaxf(max_all, slot[2 * head]);
    }
    float sum = 0.0f, acc = 0.0f;
    for (int p = 0; p < merge.num_partials; ++p) {
      const float* slot =
          a.workspace + int64_t(merge.first_partial + p * merge.stride) * a.slot_floats;
      const float m = slot[2 * head];
      if (m == -INFINITY) continue;
      const float w = expf(m - max_all);
      sum += w * slot[2 * head + 1];
      acc += w * slot[2 * a.num_heads + head * hd + c];
    }
    StoreAct(a.out, a.dtype, int64_t(merge.row) * a.out_stride + int64_t(head) * hd + c, acc / sum);
  }
}

}  // namespace kvserve::cuda::attention_kc_detail
