// More of the device API for cuda_sim.h, for the non-attention kernels
// (KV write, copies, RoPE, SwiGLU, embedding, sampling): shuffles (xor, up,
// indexed) of any 4- or 8-byte value, __ballot_sync, __ffs, __syncwarp,
// integer atomics, and function-scope __shared__ variables.
//
// Semantics as in cuda_sim.h: every shuffle, ballot and __syncwarp is a
// barrier that all 32 lanes of the warp must reach (else cuda_sim aborts).
// Atomics are relaxed atomics, as CUDA's (nothing could interleave with a
// plain read-modify-write, but ThreadSanitizer would report two threads'
// atomics on one address as a race). `__shared__` becomes `static`: one copy
// per kernel (instantiation), shared by the fibers of a CTA, CTAs running
// one after another, and poisoned with 0xff bytes before each CTA
// (cuda_sim.h RunBlock, for kernels in kvserve::cuda's *_detail
// namespaces), so a CTA that reads shared memory it did not write sees
// NaN, not the previous CTA's values; a kernel under test must not use
// `extern __shared__` (cuda_sim.h's dynamic shared memory) in the same
// translation unit.
//
// Include first, before any kernel source; defines KVSERVE_CUDA_SIM, which
// kernels/cuda/device/kv_encode.cuh reads to expose its warp team to host code.
#pragma once

// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim.h"
// clang-format on

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#define KVSERVE_CUDA_SIM 1
#undef __shared__
#define __shared__ static

namespace cuda_sim {

// Lane `lane` of every warp reads the value of lane src_lane(lane) of its
// warp (a source outside [0, 32) keeps the lane's own value).
template <typename T, typename SrcLane>
T ShuffleAny(T v, SrcLane src_lane) {
  static_assert(sizeof(T) <= 8, "shuffles move 4 or 8 bytes");
  std::vector<uint64_t>& exchange = g_block->exchange;
  const int t = g_block->current;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  exchange[t] = bits;
  Yield(kWarpBarrier);
  const int src = src_lane(t & 31);
  T r = v;
  if (src >= 0 && src < 32) {
    const int from = (t & ~31) | src;
    if (from >= static_cast<int>(g_block->fibers.size()))
      Fail("shuffle from a lane past the block");
    std::memcpy(&r, &exchange[from], sizeof(T));
  }
  Yield(kWarpBarrier);  // every lane has read before any lane writes again
  return r;
}

inline void RequireFullMask(unsigned mask) {
  if (mask != 0xffffffffu) Fail("only full-warp shuffles are simulated");
}

}  // namespace cuda_sim

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  cuda_sim::RequireFullMask(mask);
  return cuda_sim::ShuffleAny(v, [&](int lane) { return lane ^ lane_mask; });
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
  cuda_sim::RequireFullMask(mask);
  return cuda_sim::ShuffleAny(v, [&](int lane) { return lane - static_cast<int>(delta); });
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane) {
  cuda_sim::RequireFullMask(mask);
  return cuda_sim::ShuffleAny(v, [&](int) { return src_lane & 31; });
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  cuda_sim::RequireFullMask(mask);
  unsigned bits = 0;
  const unsigned mine = predicate ? 1u : 0u;
  for (int src = 0; src < 32; ++src) {
    bits |= cuda_sim::ShuffleAny(mine, [&](int) { return src; }) << src;
  }
  return bits;
}
// The device's rsqrtf is within 2 ulp of this (tests allow for it).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// A streaming load: a plain load on the CPU.
template <typename T>
T __ldcs(const T* p) {
  return *p;
}
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  cuda_sim::RequireFullMask(mask);
  cuda_sim::Yield(cuda_sim::kWarpBarrier);
}

inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
