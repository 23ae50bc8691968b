// Device code of SampleTokens (see sample.h for the contract and
// sample_row.cuh for the algorithm): BlockRowTeam, the thread-block team
// the row algorithm runs on, and the kernel.
//
// BlockRowTeam: For strides threads over [0, n) (coalesced). Reductions fold
// warp shuffles, then the per-warp partials in warp order, so every thread
// gets the same, run-to-run identical value. FindCumulative gives each warp
// a contiguous segment of ids (a multiple of 32 long): segment totals,
// then the one warp whose segment holds the target walks it 32 ids at a
// time with an inclusive warp scan and a ballot, so the result is the
// first id in id order. Histogram and count updates are integer atomics
// (order-independent, hence deterministic).
//
// Grid: (num_rows). Block: (kThreads = 512).
#pragma once

#include <cstdint>

#include "kernels/cuda/sampling/sample.h"
#include "kernels/cuda/sampling/sample_row.cuh"

namespace kvserve::cuda::sample_detail {

inline constexpr int kThreads = 512;

template <int kBlockThreads>
struct BlockRowTeam {
  static constexpr int kWarps = kBlockThreads / 32;
  struct Shared {
    uint64_t u64[kWarps];
    double f64[kWarps];
    float f32[kWarps];
    int32_t i32[kWarps];
    int32_t found;
  };
  Shared* s;

  __device__ int rank() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return kBlockThreads; }
  __device__ int warp() const { return static_cast<int>(threadIdx.x) / 32; }
  __device__ int lane() const { return static_cast<int>(threadIdx.x) % 32; }
  __device__ void Sync() const { __syncthreads(); }

  template <typename F>
  __device__ void For(int64_t n, F&& f) const {
    for (int64_t i = threadIdx.x; i < n; i += kBlockThreads) f(static_cast<int32_t>(i));
  }

  __device__ float MaxF32(float v) const {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v, offset);
      v = o > v ? o : v;
    }
    if (lane() == 0) s->f32[warp()] = v;
    __syncthreads();
    float r = s->f32[0];
    for (int k = 1; k < kWarps; ++k) r = s->f32[k] > r ? s->f32[k] : r;
    __syncthreads();
    return r;
  }

  __device__ uint64_t SumU64(uint64_t v) const {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane() == 0) s->u64[warp()] = v;
    __syncthreads();
    uint64_t r = 0;
    for (int k = 0; k < kWarps; ++k) r += s->u64[k];
    __syncthreads();
    return r;
  }

  // Addition is commutative, so both lanes of each butterfly pair compute
  // the same bits and every lane ends with the same warp total.
  __device__ double SumF64(double v) const {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane() == 0) s->f64[warp()] = v;
    __syncthreads();
    double r = 0.0;
    for (int k = 0; k < kWarps; ++k) r += s->f64[k];
    __syncthreads();
    return r;
  }

  __device__ int32_t ArgMax(float value, int32_t id) const {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, value, offset);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, id, offset);
      if (sample_row::Better(ov, oi, value, id)) {
        value = ov;
        id = oi;
      }
    }
    if (lane() == 0) {
      s->f32[warp()] = value;
      s->i32[warp()] = id;
    }
    __syncthreads();
    float best_value = 0.0f;
    int32_t best_id = -1;
    for (int k = 0; k < kWarps; ++k) {
      if (sample_row::Better(s->f32[k], s->i32[k], best_value, best_id)) {
        best_value = s->f32[k];
        best_id = s->i32[k];
      }
    }
    __syncthreads();
    return best_id;
  }

  template <typename F>
  __device__ int32_t FindCumulative(int32_t n, F&& f, uint64_t target) const {
    const int32_t segment = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
    const int32_t begin = min(n, warp() * segment), end = min(n, begin + segment);
    uint64_t local = 0;
    for (int32_t i = begin + lane(); i < end; i += 32) local += f(i);
    for (int offset = 16; offset > 0; offset >>= 1) {
      local += __shfl_xor_sync(0xffffffffu, local, offset);
    }
    if (lane() == 0) s->u64[warp()] = local;
    if (threadIdx.x == 0) s->found = -1;
    __syncthreads();
    uint64_t before = 0;
    int holder = -1;
    for (int k = 0; k < kWarps; ++k) {
      if (before + s->u64[k] > target) {
        holder = k;
        break;
      }
      before += s->u64[k];
    }
    if (warp() == holder) {
      uint64_t cumulative = before;
      for (int32_t base = begin; base < end; base += 32) {
        const int32_t i = base + lane();
        uint64_t inclusive = i < end ? f(i) : 0;
        for (int offset = 1; offset < 32; offset <<= 1) {
          const uint64_t up = __shfl_up_sync(0xffffffffu, inclusive, offset);
          if (lane() >= offset) inclusive += up;
        }
        const unsigned hits = __ballot_sync(0xffffffffu, cumulative + inclusive > target);
        if (hits != 0) {
          if (lane() == 0) s->found = base + __ffs(hits) - 1;
          break;
        }
        cumulative += __shfl_sync(0xffffffffu, inclusive, 31);
      }
    }
    __syncthreads();
    const int32_t found = s->found;
    __syncthreads();
    return found;
  }

  __device__ void HistAdd(uint64_t* bin, uint64_t w) const {
    atomicAdd(reinterpret_cast<unsigned long long*>(bin), static_cast<unsigned long long>(w));
  }
  __device__ int32_t AtomicAdd(int32_t* p, int32_t v) const { return atomicAdd(p, v); }
  __device__ int32_t AtomicOr(int32_t* p, int32_t v) const { return atomicOr(p, v); }
  __device__ int32_t AtomicExch(int32_t* p, int32_t v) const { return atomicExch(p, v); }
};

__global__ void __launch_bounds__(kThreads) SampleKernel(const SampleParams p) {
  using Team = BlockRowTeam<kThreads>;
  __shared__ typename Team::Shared team_shared;
  __shared__ sample_row::RowShared row_shared;
  const int64_t r = blockIdx.x;
  const Team team{&team_shared};
  sample_row::RowIo io;
  io.params = p.rows[r];
  io.logits = static_cast<const uint8_t*>(p.logits) + r * p.logits_stride * ActDtypeSize(p.dtype);
  io.dtype = p.dtype;
  io.vocab = p.vocab;
  io.processed = p.processed + r * p.vocab;
  io.counts = p.counts + r * p.vocab;
  io.history = p.history != nullptr ? p.history + io.params.history_begin : nullptr;
  if (io.history == nullptr) io.params.prompt_len = io.params.output_len = 0;
  sample_row::SampleRow(team, io, &row_shared, p.results + r);
}

}  // namespace kvserve::cuda::sample_detail
