// Device code of paged attention (see paged_attention.h for the contract and
// gpu_attention_plan.h for the work items).
//
// Attention kernel. Grid: (num_items, or fewer with a persistent grid,
// num_heads / hpc); block: 128 threads. CTA (x, y) takes work items x,
// x + gridDim.x, ..., each run by attention_skeleton.cuh's Item (queries,
// tiles of kTileKeys keys, online softmax, register accumulators, split-KV
// partials) over tiles of [key_begin, key_end); what is this kernel's own:
//   - all threads decode the tile's K and V rows with kv_decode.cuh (the
//     K and V element types are template arguments); keys outside the item
//     are never read;
//   - keys below the sequence's sinks are scored with the row's sink query
//     (global memory) instead of q.
// Dynamic shared memory: SmemFloats(head_dim) floats (the skeleton's).
//
// Merge kernel. Grid: (num_merges); block: 128 threads: the skeleton's
// MergeRows, which also writes softmax_stats.
//
// Numerics: exp is the accurate expf; K/V values are bitwise those of the
// CPU decoder; products and sums are fp32 in an order that differs from the
// CPU's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_skeleton.cuh"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/device/kv_decode.cuh"

namespace kvserve::cuda::attention_detail {

using attention_common::LoadAct;
using attention_common::PlanHeader;
using attention_common::StoreAct;

using attention_skeleton::kMaxQ;
using attention_skeleton::kThreads;
using attention_skeleton::kTileKeys;
using attention_skeleton::kWarps;
using attention_skeleton::SmemFloats;

// What the kernels read, resolved on the host: the skeleton's fields, then
// the per-token kernels' own.
struct KernelArgs : attention_skeleton::AttentionArgs {
  // KV eviction (all null when the step asks for none; see paged_attention.h).
  const void* sink_q = nullptr;              // [T][q_stride] like q, or null
  const int32_t* num_sinks = nullptr;        // [num_seqs], or null
  float* softmax_stats = nullptr;            // [T][num_heads][2] (max, sum), or null
  float* key_mass = nullptr;                 // MassKernel's output, or null
  const int64_t* key_mass_offset = nullptr;  // [T]; negative: row not recorded
};

// q . k of a sink key with the row's sink query (global memory), in the
// order of the shared-memory loop.
__device__ inline float SinkDot(const KernelArgs& a, int64_t qo, const float2* k2, int pairs) {
  float dot = 0.0f;
  for (int i = 0; i < pairs; ++i) {
    const float2 y = k2[i];
    dot += LoadAct(a.sink_q, a.dtype, qo + 2 * i) * y.x;
    dot += LoadAct(a.sink_q, a.dtype, qo + 2 * i + 1) * y.y;
  }
  return dot;
}

// One work item of the attention kernel (all threads of the CTA).
template <KvElem KE, KvElem VE>
__device__ __forceinline__ void AttentionItem(const KernelArgs& a,
                                              const GpuAttentionWorkItem item) {
  const KvPageLayout& layout = a.kv.layout;
  const int bs = layout.block_size;
  attention_skeleton::Item it(a, item);
  const int32_t* table = a.batch.BlockRow(item.seq);
  // Keys below `sinks` are scored with the sink query (read from global
  // memory: a few keys of the first tile); 0 when the step has no sinks.
  const int32_t sinks = a.num_sinks != nullptr ? a.num_sinks[item.seq] : 0;
  float2 acc[attention_skeleton::kSlots];
  it.Start(a, acc);

  const auto decode = [&](int32_t key, int i, float2& kf, float2& vf) {
    const uint8_t* block = a.kv.Block(table[key / bs]);
    const int slot = key % bs;
    kf = kv_decode::DecodePair<KE>(block + layout.RowOffset(layout.k, it.kv_head, slot),
                                   block + layout.MetaOffset(layout.k, it.kv_head, slot), i,
                                   layout.k.group_size);
    vf = kv_decode::DecodePair<VE>(block + layout.RowOffset(layout.v, it.kv_head, slot),
                                   block + layout.MetaOffset(layout.v, it.kv_head, slot), i,
                                   layout.v.group_size);
  };
  const auto every_row = [](int32_t) { return true; };
  const auto dot = [&](int m, int32_t key, const float2* q2, const float2* k2) {
    if (key < sinks) {
      const int64_t qo =
          (item.row_begin + m / it.hpc) * a.q_stride + int64_t(it.head0 + m % it.hpc) * it.hd;
      return SinkDot(a, qo, k2, it.pairs);
    }
    return attention_skeleton::QueryDot(q2, k2, it.pairs);
  };
  for (int32_t t0 = item.key_begin; t0 < item.key_end; t0 += kTileKeys) {
    it.Pass(a, t0, min(kTileKeys, item.key_end - t0), decode, every_row, dot, acc);
  }
  it.Finish(a, a.softmax_stats, acc);
}

// The items of the plan, for both attention kernels: CTA x runs item(w) for
// items x, x + gridDim.x, ... (one each when the grid is as wide as the
// plan; a grid sized to the CTAs resident on the device walks them all, and
// CTAs past a capacity exit at once), a barrier between two items.
template <typename ItemFn>
__device__ __forceinline__ void ForEachWorkItem(const KernelArgs& a, ItemFn item) {
  const GpuAttentionPlanHeader& header = PlanHeader(a.plan);
  const auto* items = reinterpret_cast<const GpuAttentionWorkItem*>(a.plan + header.items_offset);
  for (int32_t x = static_cast<int32_t>(blockIdx.x); x < header.num_items;
       x += static_cast<int32_t>(gridDim.x)) {
    if (x != static_cast<int32_t>(blockIdx.x)) __syncthreads();  // the last item's smem is read
    item(items[x]);
  }
}

template <KvElem KE, KvElem VE>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionKernel(const __grid_constant__ KernelArgs a) {
  ForEachWorkItem(a, [&](const GpuAttentionWorkItem& w) { AttentionItem<KE, VE>(a, w); });
}

inline __global__ void __launch_bounds__(kThreads)
    MergeKernel(const __grid_constant__ KernelArgs a) {
  attention_skeleton::MergeRows(a, a.softmax_stats);
}

using KernelFn = void (*)(KernelArgs);

// Per-key attention mass (KV eviction), after the attention and merge
// kernels. Grid: (num_tokens); block: kThreads. CTA r exits unless row r is
// recorded (key_mass_offset[r] >= 0); each thread owns keys lo + tid, lo +
// tid + kThreads, ... of the row's window and, per query head in ascending
// order (the CPU's order), recomputes the score as the attention kernel did
// (same decoder, same dot order) and adds expf(s - max) / sum with the
// head's final (max, sum) from softmax_stats. One writer per key: no atomics,
// deterministic.
template <KvElem KE>
__global__ void __launch_bounds__(kThreads) MassKernel(const __grid_constant__ KernelArgs a) {
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  const int64_t off = a.key_mass_offset[r];
  if (off < 0) return;
  const KvPageLayout& layout = a.kv.layout;
  const int hd = layout.head_dim, pairs = hd / 2, bs = layout.block_size;
  const int32_t b = a.batch.SeqOfRow(r);
  const int32_t idx = a.batch.CacheIndex(b, r);
  const int32_t lo = KeyBegin(idx, a.sliding_window);
  const int32_t* table = a.batch.BlockRow(b);
  const int32_t sinks = a.num_sinks != nullptr ? a.num_sinks[b] : 0;
  const float* st = a.softmax_stats + int64_t(r) * a.num_heads * 2;
  for (int32_t key = lo + static_cast<int32_t>(threadIdx.x); key <= idx; key += kThreads) {
    const uint8_t* block = a.kv.Block(table[key / bs]);
    const int slot = key % bs;
    const void* qbase = key < sinks ? a.sink_q : a.q;
    float total = 0.0f;
    for (int h = 0; h < a.num_heads; ++h) {
      const int kv_head = h / a.group;
      const uint8_t* krow = block + layout.RowOffset(layout.k, kv_head, slot);
      const uint8_t* kmeta = block + layout.MetaOffset(layout.k, kv_head, slot);
      const int64_t qo = int64_t(r) * a.q_stride + int64_t(h) * hd;
      float dot = 0.0f;
      for (int i = 0; i < pairs; ++i) {
        const float2 y = kv_decode::DecodePair<KE>(krow, kmeta, i, layout.k.group_size);
        dot += LoadAct(qbase, a.dtype, qo + 2 * i) * y.x;
        dot += LoadAct(qbase, a.dtype, qo + 2 * i + 1) * y.y;
      }
      const float s = dot * a.scale;
      total += expf(s - st[2 * h]) / st[2 * h + 1];
    }
    a.key_mass[off + (key - lo)] = total;
  }
}

// The mass kernel of a K element type (the V type does not matter), null
// for int4_kc. Six instantiations.
inline KernelFn MassKernelFor(KvElem k) {
  switch (k) {
    case KvElem::kFp32:
      return MassKernel<KvElem::kFp32>;
    case KvElem::kFp16:
      return MassKernel<KvElem::kFp16>;
    case KvElem::kBf16:
      return MassKernel<KvElem::kBf16>;
    case KvElem::kFp8E4m3:
      return MassKernel<KvElem::kFp8E4m3>;
    case KvElem::kInt8:
      return MassKernel<KvElem::kInt8>;
    case KvElem::kInt4:
      return MassKernel<KvElem::kInt4>;
    default:
      return nullptr;
  }
}

// Attention statistics of one layer (KV eviction): for each sequence b with
// stats_offset[b] >= 0, out[stats_offset[b] + j] for j < context_len[b] =
// the sum over its rows, in row order from 0.0f, of the row's mass of key j
// (0 where no row attends j): the CPU runner's GatherAttentionStats order.
// Grid: (num_seqs); block: kThreads, striding over j.
struct GatherArgs {
  BatchView batch;
  int32_t sliding_window;
  const float* key_mass;
  const int64_t* key_mass_offset;  // [T]
  const int64_t* stats_offset;     // [num_seqs]; negative: not recorded; includes the layer
  float* out;
};

inline __global__ void __launch_bounds__(kThreads)
    GatherMassKernel(const __grid_constant__ GatherArgs g) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int64_t so = g.stats_offset[b];
  if (so < 0) return;
  const int32_t ctx = g.batch.context_len[b];
  const int32_t r0 = g.batch.query_start[b], r1 = g.batch.query_start[b + 1];
  for (int32_t j = static_cast<int32_t>(threadIdx.x); j < ctx; j += kThreads) {
    float acc = 0.0f;
    for (int32_t r = r0; r < r1; ++r) {
      const int32_t idx = g.batch.CacheIndex(b, r);
      const int32_t lo = KeyBegin(idx, g.sliding_window);
      if (j >= lo && j <= idx) acc += g.key_mass[g.key_mass_offset[r] + (j - lo)];
    }
    g.out[so + j] = acc;
  }
}

// The attention kernel of a KV format (K element, V element): one
// instantiation per format the CUDA backend supports, null otherwise. The
// launcher and the simulated-kernel test both choose through this.
inline KernelFn AttentionKernelFor(KvElem k, KvElem v) {
  if (k == KvElem::kInt8 && v == KvElem::kInt4)
    return AttentionKernel<KvElem::kInt8, KvElem::kInt4>;
  if (k != v) return nullptr;
  switch (k) {
    case KvElem::kFp32:
      return AttentionKernel<KvElem::kFp32, KvElem::kFp32>;
    case KvElem::kFp16:
      return AttentionKernel<KvElem::kFp16, KvElem::kFp16>;
    case KvElem::kBf16:
      return AttentionKernel<KvElem::kBf16, KvElem::kBf16>;
    case KvElem::kFp8E4m3:
      return AttentionKernel<KvElem::kFp8E4m3, KvElem::kFp8E4m3>;
    case KvElem::kInt8:
      return AttentionKernel<KvElem::kInt8, KvElem::kInt8>;
    case KvElem::kInt4:
      return AttentionKernel<KvElem::kInt4, KvElem::kInt4>;
    case KvElem::kInt4Channel:  // int4_kc has no CUDA kernel yet (the runner refuses it)
      return nullptr;
  }
  return nullptr;
}

}  // namespace kvserve::cuda::attention_detail
