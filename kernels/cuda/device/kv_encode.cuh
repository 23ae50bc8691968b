// KV row encoders for the device: one token's K or V values of one head ->
// one row of a KvFormat page (data + meta), byte for byte what
// kernels/cpu/kv/kv_quant.cc's QuantizeRow writes for the same fp32 input.
//
// How the bytes stay identical: every step is a transcription of the CPU's
// scalar code, operation for operation (x / s stays a division, never
// x * (1 / s); products and sums round separately through exact_math.cuh's
// __f*_rn intrinsics, so nvcc cannot fuse them; RoundEven is the same
// magic-number trick). The only parallel parts are
//   - the row's |x| maximum (int8, fp8): a max of non-NaN values, exact in
//     any order (NaN is skipped, as the CPU's scalar `a > amax` skips it);
//   - fp8's squared-error sums: each of the 8 CPU lanes (channels i with
//     i % 8 == lane) is summed in channel order by every thread, then folded
//     as SumLanes does, so the chosen scale is the CPU's;
//   - int4's per-group min/max: one thread scans a group in channel order
//     with the CPU's comparisons (so NaN and -0/+0 resolve as they do there).
// Hence the tested bound is zero differing bytes. The CPU's own two paths
// (scalar, AVX2) agree with each other, and so with this code, except in
// two corners where this code follows the scalar path: a row holding NaN
// (AVX2's max propagates it differently) and an int4 group whose minimum
// is a zero present as both -0 and +0 (AVX2 may store the zero as +0 where
// the scalar path stores -0; both decode to the same values).
//
// The encoders are written against a Team: the threads that encode one row
// together. WarpTeam (device) is one warp; SerialTeam is one thread and runs
// on the host, which is how tests in make test check this very code against
// cpu::QuantizeRow without a GPU. The header compiles as plain C++.
//
// Team contract: rank() in [0, size()); For(n, f) calls f(i) for this
// thread's share of [0, n); Sync() is a barrier for the team (and makes its
// shared-memory writes visible); MaxNonNeg(v) folds non-negative values to
// their maximum on every thread.
//
// Thread-safety: pure device/host functions over caller-owned memory.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "kernels/cuda/device/exact_math.cuh"

namespace kvserve::cuda::kv_encode {

inline constexpr float kFp16Max = 65504.0f;
inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr float kInt8Max = 127.0f;
inline constexpr int kInt4MaxLevel = 15;
// The CPU's fp8 scale candidates (kv_quant.cc kFp8ScaleSteps).
inline constexpr float kFp8ScaleStep1 = 1.41421356f;
// Longest row the device kernel stages (its shared memory is sized by it).
inline constexpr int kMaxHeadDim = 512;

// ---- element codecs (kv_quant.cc's, transcribed) -----------------------------

KV_HOST_DEVICE inline float Saturate(float x, float limit) {
  if (x > limit) return limit;
  if (x < -limit) return -limit;
  return x;
}

// x clamped to [lo, hi]; NaN goes to lo.
KV_HOST_DEVICE inline float ClampF(float x, float lo, float hi) {
  return x > lo ? (x < hi ? x : hi) : lo;
}

KV_HOST_DEVICE inline uint16_t FloatToFp16(float x) {
  using namespace exact;
  uint32_t u = BitsOf(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  u &= 0x7fffffff;
  if (u >= 0x7f800000) return sign | (u > 0x7f800000 ? 0x7e00 : 0x7c00);
  if (u >= 0x47800000) return sign | 0x7c00;
  if (u < 0x38800000) {
    const float shifted = Add(FloatOf(u), 0.5f);
    return sign | static_cast<uint16_t>(BitsOf(shifted) - BitsOf(0.5f));
  }
  const uint32_t odd = (u >> 13) & 1;
  u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + odd;
  return sign | static_cast<uint16_t>(u >> 13);
}

KV_HOST_DEVICE inline float Fp16ToFloat(uint16_t h) {
  using namespace exact;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    const float v = Mul(static_cast<float>(m), 5.9604644775390625e-8f);  // exact
    return FloatOf(BitsOf(v) | sign);
  }
  if (e == 31) return FloatOf(sign | 0x7f800000 | (m << 13));
  return FloatOf(sign | ((e + 112) << 23) | (m << 13));
}

KV_HOST_DEVICE inline uint16_t FloatToBf16(float x) {
  const uint32_t u = exact::BitsOf(x);
  if (exact::IsNan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

KV_HOST_DEVICE inline uint8_t FloatToFp8E4m3(float x) {
  using namespace exact;
  const uint8_t sign = static_cast<uint8_t>((BitsOf(x) >> 24) & 0x80);
  if (IsNan(x)) return 0x7f;
  const float a = Abs(x);
  if (!(a < kFp8E4m3Max)) return sign | 0x7e;
  if (a < 0.015625f) return sign | static_cast<uint8_t>(RoundEven(Mul(a, 512.0f)));
  const uint32_t u = BitsOf(a);
  const uint32_t rounded = u + 0x7ffff + ((u >> 20) & 1);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120 << 3));
}

// The CPU's decoding table, computed: code 0x7f (and 0xff) is NaN.
KV_HOST_DEVICE inline float Fp8E4m3ToFloat(uint8_t b) {
  using namespace exact;
  const uint32_t em = b & 0x7f, sign = static_cast<uint32_t>(b & 0x80) << 24;
  if (em == 0x7f) return FloatOf(sign | 0x7fc00000u);
  const float v = em < 8 ? Mul(static_cast<float>(em), 1.0f / 512.0f)  // m * 2^-9, exact
                         : FloatOf((em << 20) + (120u << 23));         // rebias 7 -> 127
  return FloatOf(BitsOf(v) | sign);
}

KV_HOST_DEVICE inline float Int8Code(float x, float scale) {
  using namespace exact;
  return ClampF(RoundEven(ClampF(Div(x, scale), -256.0f, 256.0f)), -kInt8Max, kInt8Max);
}

// ---- unaligned-safe stores (page offsets keep 2- and 4-byte alignment) ----------

KV_HOST_DEVICE inline void Store16(uint8_t* p, uint16_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint16_t*>(p) = v;
#else
  std::memcpy(p, &v, 2);
#endif
}

KV_HOST_DEVICE inline void Store32(uint8_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, 4);
#endif
}

// ---- teams ------------------------------------------------------------------------

// One host thread encodes the row alone.
struct SerialTeam {
  int rank() const { return 0; }
  int size() const { return 1; }
  void Sync() const {}
  float MaxNonNeg(float v) const { return v; }
  template <typename F>
  void For(int n, F&& f) const {
    for (int i = 0; i < n; ++i) f(i);
  }
};

#if defined(__CUDACC__) || defined(KVSERVE_CUDA_SIM)
// One warp (all 32 lanes active) encodes the row. (KVSERVE_CUDA_SIM: the
// host-compiled simulation of tests/kernels/cuda_sim runs it too.)
struct WarpTeam {
  __device__ int rank() const { return static_cast<int>(threadIdx.x % 32); }
  __device__ int size() const { return 32; }
  __device__ void Sync() const { __syncwarp(); }
  __device__ float MaxNonNeg(float v) const {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v, offset);
      v = o > v ? o : v;
    }
    return v;
  }
  template <typename F>
  __device__ void For(int n, F&& f) const {
    for (int i = rank(); i < n; i += 32) f(i);
  }
};
#endif

// ---- rows -------------------------------------------------------------------------

// Largest |x[i]| over non-NaN values (0 for none), on every thread.
template <typename Team>
KV_HOST_DEVICE float RowAbsMax(const Team& team, const float* x, int n) {
  float amax = 0.0f;
  team.For(n, [&](int i) {
    const float a = exact::Abs(x[i]);
    amax = a > amax ? a : amax;
  });
  return team.MaxNonNeg(amax);
}

// Encodes x[0, head_dim) as one row of `part` into data (part.row_bytes) and
// meta (part.meta_bytes). x and scratch (head_dim floats) must be visible to
// the whole team (shared memory on the device) and x must be complete before
// the call (the caller syncs). scratch is clobbered. head_dim <= kMaxHeadDim,
// even, and a multiple of part.group_size for int4.
template <typename Team>
KV_HOST_DEVICE void EncodeRow(const Team& team, const KvPartLayout& part, int head_dim,
                              const float* x, float* scratch, uint8_t* data, uint8_t* meta) {
  using namespace exact;
  const int n = head_dim;
  switch (part.elem) {
    case KvElem::kFp32:
      team.For(n, [&](int i) { Store32(data + 4 * i, BitsOf(x[i])); });
      return;
    case KvElem::kFp16:
      team.For(n, [&](int i) { Store16(data + 2 * i, FloatToFp16(Saturate(x[i], kFp16Max))); });
      return;
    case KvElem::kBf16:
      team.For(n, [&](int i) { Store16(data + 2 * i, FloatToBf16(x[i])); });
      return;
    case KvElem::kInt8: {
      float scale = Div(RowAbsMax(team, x, n), kInt8Max);
      if (!(scale > 0.0f) || !IsFinite(scale)) {
        scale = 0.0f;
        team.For(n, [&](int i) { data[i] = 0; });
      } else {
        team.For(n, [&](int i) {
          data[i] = static_cast<uint8_t>(static_cast<int8_t>(Int8Code(x[i], scale)));
        });
      }
      if (team.rank() == 0) Store32(meta, BitsOf(scale));
      return;
    }
    case KvElem::kFp8E4m3: {
      const float base = Div(RowAbsMax(team, x, n), kFp8E4m3Max);
      if (!(base > 0.0f) || !IsFinite(base)) {
        team.For(n, [&](int i) { data[i] = 0; });
        if (team.rank() == 0) Store32(meta, BitsOf(0.0f));
        return;
      }
      float scale = base, best = FloatOf(0x7f800000u);  // +inf
      for (int c = 0; c < 2; ++c) {
        const float s = Mul(base, c == 0 ? 1.0f : kFp8ScaleStep1);
        team.For(n, [&](int i) {
          const float d = Sub(Mul(Fp8E4m3ToFloat(FloatToFp8E4m3(Div(x[i], s))), s), x[i]);
          scratch[i] = Mul(d, d);
        });
        team.Sync();
        // Every thread sums the CPU's 8 lanes in channel order, then folds
        // them as SumLanes does, so all agree on the CPU's error.
        float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int i0 = 0; i0 < n; i0 += 8) {
          for (int j = 0; j < 8; ++j) {  // unrolled: lanes stay in registers
            if (i0 + j < n) lanes[j] = Add(lanes[j], scratch[i0 + j]);
          }
        }
        const float err = Add(Add(Add(lanes[0], lanes[4]), Add(lanes[2], lanes[6])),
                              Add(Add(lanes[1], lanes[5]), Add(lanes[3], lanes[7])));
        team.Sync();  // scratch is rewritten by the next candidate
        if (err < best) {
          best = err;
          scale = s;
        }
      }
      team.For(n, [&](int i) { data[i] = FloatToFp8E4m3(Div(x[i], scale)); });
      if (team.rank() == 0) Store32(meta, BitsOf(scale));
      return;
    }
    case KvElem::kInt4Channel:  // per block, not per row: WriteKv refuses int4_kc pages
      return;
    case KvElem::kInt4: {
      // bits 4 (int4) or 2 (int2_kc's V): levels KvCodeLevels(bits), 8 / bits
      // codes a byte.
      const int group = part.group_size, num_groups = n / group;
      const int bits = part.bits, per = 8 / bits;
      const float levels = static_cast<float>(KvCodeLevels(bits));
      // Phase 1: one thread per group finds min/max in the CPU's order and
      // stores the group's fp16 [scale, zero]; the decoded values go to
      // scratch[2g], scratch[2g + 1] for phase 2.
      team.For(num_groups, [&](int g) {
        const int g0 = g * group;
        float mn = x[g0], mx = x[g0];
        for (int i = g0 + 1; i < g0 + group; ++i) {
          mn = x[i] < mn ? x[i] : mn;
          mx = x[i] > mx ? x[i] : mx;
        }
        // +0 for either signed zero, as cpu::QuantizeRow stores.
        mn = Add(mn, 0.0f);
        mx = Add(mx, 0.0f);
        const uint16_t scale_h = FloatToFp16(Saturate(Div(Sub(mx, mn), levels), kFp16Max));
        const uint16_t zero_h = FloatToFp16(Saturate(mn, kFp16Max));
        Store32(meta + 4 * g,
                static_cast<uint32_t>(scale_h) | (static_cast<uint32_t>(zero_h) << 16));
        scratch[2 * g] = Fp16ToFloat(scale_h);
        scratch[2 * g + 1] = Fp16ToFloat(zero_h);
      });
      team.Sync();
      // Phase 2: one byte (channels per * p ..) per step; a group holds
      // whole bytes (group sizes are multiples of per).
      team.For(n / per, [&](int p) {
        const int g = (per * p) / group;
        const float scale = scratch[2 * g], zero = scratch[2 * g + 1];
        uint32_t byte = 0;
        if (scale > 0.0f) {
          for (int k = 0; k < per; ++k) {
            const float c = RoundEven(Div(Sub(x[per * p + k], zero), scale));
            byte |= static_cast<uint32_t>(ClampF(c, 0.0f, levels)) << (k * bits);
          }
        }
        data[p] = static_cast<uint8_t>(byte);
      });
      team.Sync();  // scratch is free again only after every thread read it
      return;
    }
  }
}

}  // namespace kvserve::cuda::kv_encode
