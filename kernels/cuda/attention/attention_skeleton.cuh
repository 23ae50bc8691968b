// The work-item skeleton of the two reference attention kernels (the
// per-token formats' in paged_attention_kernel.cuh, int4_kc's in
// paged_attention_kc_kernel.cuh); the fast kernel has its own.
//
// A CTA of kThreads threads takes a work item of gpu_attention_plan.h: nr
// rows of one sequence and the hpc query heads [y * hpc, (y + 1) * hpc) of
// kv head y * hpc / group, so nq = nr * hpc <= 16 query vectors (m = row *
// hpc + head). An Item loads the queries into shared memory, then runs
// passes over tiles of at most kTileKeys keys, each:
//   1. all threads decode the tile's K and V rows into shared memory as
//      fp32, one channel pair per thread and step, through the kernel's
//      decode(key, i, kf, vf): how a key is read from its page format;
//   2. scores s[m][j] = dot(m, key, k_j) * scale, one per thread and step,
//      -inf where key j is outside row m's causal window [KeyBegin(i), i]
//      or where the kernel's visible(i) says the pass is not row i's;
//   3. online softmax, one warp per query vector (kTileKeys == warp size):
//      new max, p = exp(s - max), rescale factor for the running sum and
//      accumulators; a query vector with no key yet keeps max = -inf;
//   4. acc[m][c] = acc * alpha + sum_j p[m][j] * v_j[c], each thread owning
//      fixed (m, channel pair) slots in registers for the whole item.
// Finish then writes an unsplit item (partial < 0) as out = acc / sum, or
// a partition's (max, sum) and acc to its workspace slot; MergeRows
// combines the partitions of split rows. Every fp32 operation and its order
// is fixed here, so a kernel's numerics are its decoder's and this file's.
//
// Shared memory (floats): q [16][ld], k [32][ld], v [32][ld], p [16][32],
// max/sum/alpha [16] each, ld = head_dim rounded so that ld / 2 is odd (rows
// of float2 fall in distinct bank pairs: conflict-free score loads).
// head_dim 128: 43.8 KB; 256: 84.8 KB (opted in by the launchers).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/paged_view.h"
#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve::cuda::attention_skeleton {

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

// What both kernels read, resolved on the host (attention_launch.h fills
// it); each kernel's KernelArgs adds its own fields after these.
struct AttentionArgs {
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
};

// q . k over `pairs` channel pairs, in the order both kernels score a key in.
__device__ __forceinline__ float QueryDot(const float2* q2, const float2* k2, int pairs) {
  float dot = 0.0f;
  for (int i = 0; i < pairs; ++i) {
    const float2 x = q2[i], y = k2[i];
    dot += x.x * y.x;
    dot += x.y * y.y;
  }
  return dot;
}

// One work item in flight (all threads of the CTA): the item's indices and
// its shared tiles. The caller owns this thread's accumulators (float2
// acc[kSlots], fixed (m, channel pair) slots, passed to each call): held
// as a member, or with the tiles as pointer members, they cost the
// per-token kernel about 20 more registers (ptxas, sm_90a).
class Item {
 public:
  const int hd, pairs, ld;
  const int hpc, head0, kv_head, nq;
  const int tid, lane, warp;
  const int32_t first_index;  // the cache index of the item's first row

  __device__ __forceinline__ Item(const AttentionArgs& a, const GpuAttentionWorkItem& item)
      : hd(a.kv.layout.head_dim),
        pairs(hd / 2),
        ld(SmemLd(hd)),
        hpc(a.heads_per_cta),
        head0(static_cast<int>(blockIdx.y) * hpc),
        kv_head(head0 / a.group),
        nq(item.num_rows * hpc),
        tid(static_cast<int>(threadIdx.x)),
        lane(tid % 32),
        warp(tid / 32),
        first_index(a.batch.CacheIndex(item.seq, item.row_begin)),
        item_(item) {}

  // Loads the item's query vectors and starts its running state (before
  // the first pass, whose barrier publishes them).
  __device__ __forceinline__ void Start(const AttentionArgs& a, float2 (&acc)[kSlots]) {
    for (int e = tid; e < nq * hd; e += kThreads) {
      const int m = e / hd, c = e % hd;
      const int64_t row = item_.row_begin + m / hpc;
      const int head = head0 + m % hpc;
      q_s()[m * ld + c] = LoadAct(a.q, a.dtype, row * a.q_stride + int64_t(head) * hd + c);
    }
    if (tid < kMaxQ) {
      max_s()[tid] = -INFINITY;
      sum_s()[tid] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kSlots; ++i) acc[i] = make_float2(0.0f, 0.0f);
  }

  // One pass over keys t0 .. t0 + n - 1 (n <= kTileKeys): decode(key, i,
  // kf, vf) sets channels 2i, 2i + 1 of the key's K and V rows;
  // visible(index) is false where the row at that cache index must not see
  // this pass; dot(m, key, q2, k2) is query vector m's product with the
  // key's decoded K row (q2: m's row of the q tile, for QueryDot).
  template <typename Decode, typename Visible, typename Dot>
  __device__ __forceinline__ void Pass(const AttentionArgs& a, int32_t t0, int n, Decode decode,
                                       Visible visible, Dot dot, float2 (&acc)[kSlots]) {
    __syncthreads();  // the previous tile is consumed (first pass: q and state are set)

    // 1. Decode K and V of the tile's keys.
    for (int e = tid; e < n * pairs; e += kThreads) {
      const int j = e / pairs, i = e % pairs;
      float2 kf, vf;
      decode(t0 + j, i, kf, vf);
      reinterpret_cast<float2*>(k_s() + j * ld)[i] = kf;
      reinterpret_cast<float2*>(v_s() + j * ld)[i] = vf;
    }
    __syncthreads();

    // 2. Scores, masked to each row's [KeyBegin(i), i] and to this pass.
    for (int e = tid; e < nq * kTileKeys; e += kThreads) {
      const int m = e / kTileKeys, j = e % kTileKeys;
      const int32_t index = first_index + m / hpc;
      const int32_t key = t0 + j;
      float s = -INFINITY;
      if (j < n && key <= index && key >= KeyBegin(index, a.sliding_window) && visible(index)) {
        s = dot(m, key, reinterpret_cast<const float2*>(q_s() + m * ld),
                reinterpret_cast<const float2*>(k_s() + j * ld)) *
            a.scale;
      }
      p_s()[m * kTileKeys + j] = s;
    }
    __syncthreads();

    // 3. Online softmax, one warp per query vector, one key per lane.
    for (int m = warp; m < nq; m += kWarps) {
      const float s = p_s()[m * kTileKeys + lane];
      const float old_max = max_s()[m];
      const float new_max = fmaxf(old_max, WarpMax(s));
      float p = 0.0f, alpha = 1.0f;
      if (new_max != -INFINITY) {
        p = expf(s - new_max);            // s = -inf (masked) gives 0
        alpha = expf(old_max - new_max);  // old_max = -inf (first keys) gives 0
      }
      const float tile_sum = WarpSum(p);
      p_s()[m * kTileKeys + lane] = p;
      if (lane == 0) {
        max_s()[m] = new_max;
        sum_s()[m] = sum_s()[m] * alpha + tile_sum;
        alpha_s()[m] = alpha;
      }
    }
    __syncthreads();

    // 4. acc = acc * alpha + P V over the tile.
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = tid + s * kThreads;
      if (e >= nq * pairs) break;
      const int m = e / pairs, i = e % pairs;
      const float alpha = alpha_s()[m];
      float2 r = make_float2(acc[s].x * alpha, acc[s].y * alpha);
      const float* p_row = p_s() + m * kTileKeys;
      for (int j = 0; j < n; ++j) {
        const float p = p_row[j];
        const float2 v = reinterpret_cast<const float2*>(v_s() + j * ld)[i];
        r.x += p * v.x;
        r.y += p * v.y;
      }
      acc[s] = r;
    }
  }

  // Writes the item after its last pass: an unsplit item's rows to out (and
  // each query vector's final (max, sum) to softmax_stats, when not null),
  // a partition's (max, sum) and acc to its workspace slot. max_s / sum_s
  // were last written before the barrier that preceded the last step 4.
  __device__ __forceinline__ void Finish(const AttentionArgs& a, float* softmax_stats,
                                         const float2 (&acc)[kSlots]) const {
    if (item_.partial < 0) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int e = tid + s * kThreads;
        if (e >= nq * pairs) break;
        const int m = e / pairs, i = e % pairs;
        const int64_t row = item_.row_begin + m / hpc;
        const int head = head0 + m % hpc;
        const float inv = 1.0f / sum_s()[m];
        const int64_t o = row * a.out_stride + int64_t(head) * hd + 2 * i;
        StoreAct(a.out, a.dtype, o, acc[s].x * inv);
        StoreAct(a.out, a.dtype, o + 1, acc[s].y * inv);
      }
      if (softmax_stats != nullptr && tid < nq) {
        const int64_t row = item_.row_begin + tid / hpc;
        float* st = softmax_stats + (row * a.num_heads + head0 + tid % hpc) * 2;
        st[0] = max_s()[tid];
        st[1] = sum_s()[tid];
      }
      return;
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = tid + s * kThreads;
      if (e >= nq * pairs) break;
      const int m = e / pairs, i = e % pairs;
      float* slot = a.workspace + (item_.partial + m / hpc) * a.slot_floats;
      const int head = head0 + m % hpc;
      reinterpret_cast<float2*>(slot + 2 * a.num_heads + int64_t(head) * hd)[i] = acc[s];
    }
    if (tid < nq) {
      float* slot = a.workspace + (item_.partial + tid / hpc) * a.slot_floats;
      const int head = head0 + tid % hpc;
      slot[2 * head] = max_s()[tid];
      slot[2 * head + 1] = sum_s()[tid];
    }
  }

 private:
  const GpuAttentionWorkItem item_;

  // The shared tiles, in the order of the layout above.
  __device__ __forceinline__ static float* Smem() {
#if defined(CUDA_SIM_DYNAMIC_SHARED)
    return static_cast<float*>(::cuda_sim::g_dynamic_shared);
#else
    extern __shared__ float4 smem4[];
    return reinterpret_cast<float*>(smem4);
#endif
  }
  __device__ __forceinline__ float* q_s() const { return Smem(); }
  __device__ __forceinline__ float* k_s() const { return q_s() + kMaxQ * ld; }
  __device__ __forceinline__ float* v_s() const { return k_s() + kTileKeys * ld; }
  __device__ __forceinline__ float* p_s() const { return v_s() + kTileKeys * ld; }
  __device__ __forceinline__ float* max_s() const { return p_s() + kMaxQ * kTileKeys; }
  __device__ __forceinline__ float* sum_s() const { return max_s() + kMaxQ; }
  __device__ __forceinline__ float* alpha_s() const { return sum_s() + kMaxQ; }
};

// The merge kernel's body. Grid: (num_merges, num_heads), one CTA a row and
// head (MergeGrid: a decode step of one sequence merges 32 heads in 32 CTAs,
// not in one CTA's loop, which took about 37 us a layer on an H200); block:
// kThreads, striding over the head's channels: max over partitions, weights
// exp(m_p - max) (0 for a partition that saw no key), out = sum w_p acc_p /
// sum w_p l_p; the head's (max, sum) to softmax_stats when not null.
__device__ __forceinline__ void MergeRows(const AttentionArgs& a, float* softmax_stats) {
  const GpuAttentionPlanHeader& header = PlanHeader(a.plan);
  if (static_cast<int32_t>(blockIdx.x) >= header.num_merges) return;
  const GpuAttentionMergeItem merge =
      reinterpret_cast<const GpuAttentionMergeItem*>(a.plan + header.merges_offset)[blockIdx.x];
  const int hd = a.kv.layout.head_dim;
  const int head = static_cast<int>(blockIdx.y);
  for (int c = static_cast<int>(threadIdx.x); c < hd; c += kThreads) {
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
    if (softmax_stats != nullptr && c == 0) {
      float* st = softmax_stats + (int64_t(merge.row) * a.num_heads + head) * 2;
      st[0] = max_all;
      st[1] = sum;
    }
  }
}

// The merge kernel's grid (MergeRows).
inline dim3 MergeGrid(int32_t num_merges, int32_t num_heads) {
  return dim3(static_cast<unsigned>(num_merges), static_cast<unsigned>(num_heads));
}

}  // namespace kvserve::cuda::attention_skeleton
