// The small fixtures the KvCacheManager tests share: the tiny pool they run
// on (8 blocks of 4 tokens, 4 host blocks; with tails 3 primary and 2 host
// tails), token ranges, and a sequence's block ids.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "cache/kv_cache_manager.h"

namespace kvserve::testing {

inline KvCacheConfig Tiny(bool prefix_caching = true) {
  KvCacheConfig c;
  c.block_size = 4;
  c.num_blocks = 8;
  c.num_swap_blocks = 4;
  c.enable_prefix_caching = prefix_caching;
  return c;
}

inline KvCacheConfig TinyWithTails(bool prefix_caching = true) {
  KvCacheConfig c = Tiny(prefix_caching);
  c.num_tail_blocks = 3;
  c.num_swap_tail_blocks = 2;
  return c;
}

// start, start + 1, ..., start + n - 1
inline std::vector<int32_t> Range(int32_t start, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

inline const std::vector<BlockId>& Blocks(const KvCacheManager& kv, SeqId seq) {
  return kv.block_table(seq).blocks();
}

}  // namespace kvserve::testing
