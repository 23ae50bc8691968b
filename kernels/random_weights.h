// The dummy-weight generator (model/loader/dummy_model.h) as one host+device
// function, so the CUDA runner can fill random weights on the device that
// equal, bit for bit, what the host loader computes: element i of a stream is
// a pure function of (stream key, i).
//
// Value: the sum of the four 16-bit fields of SplitMix64(key + (i + 1) *
// golden), centred and scaled to std 0.02 (Irwin-Hall, close enough to normal
// for weights nobody reads). Every step is integer arithmetic, one int64 ->
// float conversion and one float multiply, so host and device round alike.
//
// No dependencies beyond <cstdint> (nvcc includes it). Thread-safety: pure.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"  // KV_HOST_DEVICE

namespace kvserve {

KV_HOST_DEVICE inline uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The stream key of a seed.
KV_HOST_DEVICE inline uint64_t DummyStreamKey(uint64_t seed) { return SplitMix64(seed); }

// Element i of the stream `key`.
KV_HOST_DEVICE inline float DummyWeight(uint64_t key, uint64_t i) {
  const uint64_t r = SplitMix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
  const int64_t sum = static_cast<int64_t>(r & 0xffff) + static_cast<int64_t>((r >> 16) & 0xffff) +
                      static_cast<int64_t>((r >> 32) & 0xffff) + static_cast<int64_t>(r >> 48);
  // Sum of 4 uniforms on [0, 65535]: mean 131070, std ~ 65536 / sqrt(3);
  // 0.02 * sqrt(3) / 65536 rounded to float once.
  constexpr float kScale = 0.02f * 1.7320508f / 65536.0f;
  return static_cast<float>(sum - 131070) * kScale;
}

}  // namespace kvserve
