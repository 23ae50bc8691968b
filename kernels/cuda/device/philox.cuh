// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11), the counter-based generator curand_kernel.h calls
// curandStatePhilox4_32_10_t, written out so host code computes the very
// bits the device does (host tests of the sampler, reproducibility checks).
//
// Philox4x32_10 reproduces Random123's known-answer vectors (tested in make
// test). With key = {seed low, seed high} and counter = {0, 0, step low,
// step high} it is what curand_kernel.h's
//   curand_init(seed, /*subsequence=*/step, /*offset=*/0, &s); curand4(&s)
// returns (curand_philox4x32_x.h: the subsequence is the counter's upper
// 64 bits). A draw is a pure function of (seed, step): no state to carry
// between steps.
//
// Thread-safety: pure functions. Compiles as plain C++ too.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"

namespace kvserve::cuda::philox {

struct Uint4 {
  uint32_t x, y, z, w;
};

KV_HOST_DEVICE inline uint32_t MulHiLo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

KV_HOST_DEVICE inline Uint4 Philox4x32_10(Uint4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = MulHiLo(kM0, c.x, &hi0);
    const uint32_t lo1 = MulHiLo(kM1, c.z, &hi1);
    c = Uint4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The 64 random bits of draw `step` of the sequence keyed by `seed`: the
// first two 32-bit outputs of Philox4x32_10 at counter {0, 0, step}, x in
// the high half.
KV_HOST_DEVICE inline uint64_t DrawBits(uint64_t seed, uint64_t step) {
  const Uint4 r =
      Philox4x32_10(Uint4{0u, 0u, static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)},
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(r.x) << 32) | r.y;
}

}  // namespace kvserve::cuda::philox
