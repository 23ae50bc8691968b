// Device code of paged attention (see paged_attention.h for the contract and
// gpu_attention_plan.h for the work items).
//
// Attention kernel. Grid: (num_items, or fewer with a persistent grid,
// num_heads / hpc); block: 128 threads. CTA (x, y) takes work items x,
// x + gridDim.x, ..., each: nr <= kRowsMax rows of one sequence and the
// hpc query heads [y * hpc, (y + 1) * hpc) of kv head y * hpc / group, so
// nq = nr * hpc <= 16 query vectors (m = row * hpc + head) read every K/V
// page of the item once. Per tile of kTileKeys keys of [key_begin, key_end):
//   1. all threads decode the tile's K and V rows (kv_decode.cuh) into
//      shared memory as fp32, one channel pair per thread and step; keys
//      outside the item are never read;
//   2. scores s[m][j] = (q_m . k_j) * scale, one per thread and step, -inf
//      where key j is outside row m's causal window [KeyBegin(i), i];
//   3. online softmax, one warp per query vector (kTileKeys == warp size):
//      new max, p = exp(s - max), rescale factor for the running sum and
//      accumulators; a query vector with no key yet keeps max = -inf;
//   4. acc[m][c] = acc * alpha + sum_j p[m][j] * v_j[c], each thread owning
//      fixed (m, channel pair) slots in registers for the whole item.
// Then an unsplit item (partial < 0) writes out = acc / sum; a partition
// writes (max, sum) and acc to its workspace slot.
//
// Shared memory (floats): q [16][ld], k [32][ld], v [32][ld], p [16][32],
// max/sum/alpha [16] each, ld = head_dim rounded so that ld / 2 is odd (rows
// of float2 fall in distinct bank pairs: conflict-free score loads).
// head_dim 128: 43.8 KB; 256: 84.8 KB (opted in by the launcher).
//
// Merge kernel. Grid: (num_merges); block: 128 threads, striding over
// (head, channel) of the row: max over partitions, weights exp(m_p - max)
// (0 for a partition that saw no key), out = sum w_p acc_p / sum w_p l_p.
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
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/device/kv_decode.cuh"

namespace kvserve::cuda::attention_detail {

using attention_common::LoadAct;
using attention_common::PlanHeader;
using attention_common::StoreAct;
using attention_common::WarpMax;
using attention_common::WarpSum;

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kMaxQ = kGpuAttentionMaxQueryVectors;  // 16
inline constexpr int kTileKeys = 32;                        // one per lane in the softmax
inline constexpr int kMaxPairs = kGpuAttentionMaxHeadDim / 2;
// Accumulator slots (m, channel pair) per thread.
inline constexpr int kSlots = kMaxQ * kMaxPairs / kThreads;
static_assert(kMaxQ * kMaxPairs % kThreads == 0);

// Row stride of the shared tiles in floats: even (float2 rows) with ld / 2 odd.
__host__ __device__ constexpr int SmemLd(int head_dim) { return ((head_dim / 2) | 1) * 2; }

__host__ __device__ constexpr int SmemFloats(int head_dim) {
  return (kMaxQ + 2 * kTileKeys) * SmemLd(head_dim) + kMaxQ * kTileKeys + 3 * kMaxQ;
}

// What the kernels read, resolved on the host.
struct KernelArgs {
  const void* q;
  void* out;
  int64_t q_stride;
  int64_t out_stride;
  ActDtype dtype;
  PagedKvView kv;
  BatchView batch;
  int32_t num_heads;
  int32_t group;          // query heads per kv head
  int32_t heads_per_cta;  // hpc
  float scale;
  int32_t sliding_window;
  const int32_t* plan;
  float* workspace;
  int64_t slot_floats;  // GpuAttentionSlotFloats
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
  const int32_t* table = a.batch.BlockRow(item.seq);
  // Keys below `sinks` are scored with the sink query (read from global
  // memory: a few keys of the first tile); 0 when the step has no sinks.
  const int32_t sinks = a.num_sinks != nullptr ? a.num_sinks[item.seq] : 0;

#if defined(CUDA_SIM_DYNAMIC_SHARED)
  float4* smem4 = static_cast<float4*>(::cuda_sim::g_dynamic_shared);
#else
  extern __shared__ float4 smem4[];
#endif
  float* q_s = reinterpret_cast<float*>(smem4);
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

  for (int32_t t0 = item.key_begin; t0 < item.key_end; t0 += kTileKeys) {
    const int n = min(kTileKeys, item.key_end - t0);
    __syncthreads();  // the previous tile is consumed (first pass: q and state are set)

    // 1. Decode K and V of keys t0 .. t0 + n - 1.
    for (int e = tid; e < n * pairs; e += kThreads) {
      const int j = e / pairs, i = e % pairs;
      const int32_t key = t0 + j;
      const uint8_t* block = a.kv.Block(table[key / bs]);
      const int slot = key % bs;
      const float2 kf = kv_decode::DecodePair<KE>(
          block + layout.RowOffset(layout.k, kv_head, slot),
          block + layout.MetaOffset(layout.k, kv_head, slot), i, layout.k.group_size);
      const float2 vf = kv_decode::DecodePair<VE>(
          block + layout.RowOffset(layout.v, kv_head, slot),
          block + layout.MetaOffset(layout.v, kv_head, slot), i, layout.v.group_size);
      reinterpret_cast<float2*>(k_s + j * ld)[i] = kf;
      reinterpret_cast<float2*>(v_s + j * ld)[i] = vf;
    }
    __syncthreads();

    // 2. Scores, masked to each row's [KeyBegin(i), i].
    for (int e = tid; e < nq * kTileKeys; e += kThreads) {
      const int m = e / kTileKeys, j = e % kTileKeys;
      const int32_t index = first_index + m / hpc;
      const int32_t key = t0 + j;
      float s = -INFINITY;
      if (j < n && key <= index && key >= KeyBegin(index, a.sliding_window)) {
        const float2* k2 = reinterpret_cast<const float2*>(k_s + j * ld);
        float dot = 0.0f;
        if (key < sinks) {
          const int64_t qo =
              (item.row_begin + m / hpc) * a.q_stride + int64_t(head0 + m % hpc) * hd;
          dot = SinkDot(a, qo, k2, pairs);
        } else {
          const float2* q2 = reinterpret_cast<const float2*>(q_s + m * ld);
          for (int i = 0; i < pairs; ++i) {
            const float2 x = q2[i], y = k2[i];
            dot += x.x * y.x;
            dot += x.y * y.y;
          }
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
        p = expf(s - new_max);            // s = -inf (masked) gives 0
        alpha = expf(old_max - new_max);  // old_max = -inf (first keys) gives 0
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
  // max_s / sum_s were last written before the barrier that preceded step 4.

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
    if (a.softmax_stats != nullptr && tid < nq) {
      const int64_t row = item.row_begin + tid / hpc;
      float* st = a.softmax_stats + (row * a.num_heads + head0 + tid % hpc) * 2;
      st[0] = max_s[tid];
      st[1] = sum_s[tid];
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
      if (m == -INFINITY) continue;  // this partition held none of the row's keys
      const float w = expf(m - max_all);
      sum += w * slot[2 * head + 1];
      acc += w * slot[2 * a.num_heads + head * hd + c];
    }
    StoreAct(a.out, a.dtype, int64_t(merge.row) * a.out_stride + int64_t(head) * hd + c, acc / sum);
    if (a.softmax_stats != nullptr && c == 0) {
      float* st = a.softmax_stats + (int64_t(merge.row) * a.num_heads + head) * 2;
      st[0] = max_all;
      st[1] = sum;
    }
  }
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
