// Internal to KvCacheManager's sources: kv_cache_manager.cc (admission,
// growth, branching, the per-step copies, views and the invariant check),
// kv_cache_manager_evict.cc (Evict) and kv_cache_manager_swap.cc (SwapOut,
// SwapIn and their counts). The loud abort on a broken invariant and the
// helpers their messages share.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "cache/kv_cache_manager.h"

namespace kvserve::cache_internal {

[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "KvCacheManager invariant broken: %s\n", what.c_str());
  std::abort();
}

inline void CheckNoDuplicates(std::span<const SeqId> seqs, const char* op) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t j = i + 1; j < seqs.size(); ++j) {
      if (seqs[i] == seqs[j]) Die(absl::StrCat(op, " names sequence ", seqs[i], " twice"));
    }
  }
}

// "1 block", "2 blocks".
inline std::string Blocks(int64_t n, const char* kind = "") {
  return absl::StrCat(n, " ", kind, n == 1 ? "block" : "blocks");
}

}  // namespace kvserve::cache_internal
