#include "cache/block_hash.h"

#include <cstring>

namespace kvserve {
namespace {

// Odd 64-bit constants with well-spread bits (golden ratio and friends).
constexpr uint64_t kMulWord = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMulAcc = 0xD6E8FEB86659FD93ull;
constexpr uint64_t kAddAcc = 0xA0761D6478BD642Full;
constexpr uint64_t kInit = 0xE7037ED1A0B428DBull;

constexpr uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// One round: for a fixed word this is a bijection of acc (xor, rotate, odd
// multiply, add), so no two states merge; the word is pre-multiplied so all
// of its bits reach the high half before the rotate folds them back down.
constexpr uint64_t Absorb(uint64_t acc, uint64_t word) {
  return Rotl(acc ^ (word * kMulWord), 29) * kMulAcc + kAddAcc;
}

// Final avalanche (the murmur3 64-bit finaliser's shape).
constexpr uint64_t Finish(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

BlockHash HashBlock(BlockHash parent, uint64_t extra_key, std::span<const int32_t> tokens) {
  uint64_t acc = Absorb(parent ^ kInit, extra_key);
  const size_t n = tokens.size();
  size_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint64_t word = static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
                          static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32;
    acc = Absorb(acc, word);
  }
  if (i < n) acc = Absorb(acc, static_cast<uint32_t>(tokens[i]) | (uint64_t{1} << 63));
  return Finish(acc ^ n);
}

uint64_t HashCacheSalt(std::string_view salt) {
  if (salt.empty()) return 0;
  uint64_t acc = kInit;
  size_t i = 0;
  for (; i + 8 <= salt.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, salt.data() + i, 8);
    acc = Absorb(acc, word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, salt.data() + i, salt.size() - i);
  acc = Absorb(acc, tail);
  // Never 0, so a non-empty salt never looks like "no salt".
  const uint64_t h = Finish(acc ^ salt.size());
  return h == 0 ? 1 : h;
}

}  // namespace kvserve
