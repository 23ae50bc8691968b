#include <algorithm>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_cache_manager.h"
#include "cache/kv_cache_manager_internal.h"

namespace kvserve {
namespace {

using cache_internal::Blocks;
using cache_internal::Die;

}  // namespace

// ---- Eviction ---------------------------------------------------------------

absl::StatusOr<EvictResult> KvCacheManager::Evict(SeqId seq, std::span<const int32_t> victims) {
  SeqState& s = GetResident(seq, "Evict");
  const int32_t n = s.table.num_tokens();
  const int32_t bs = config_.block_size;
  if (s.moves_pending) Die(absl::StrCat("Evict of sequence ", seq, " with slot moves pending"));
  // int4_kc's K scales cover whole blocks: single rows cannot move.
  if (has_tails()) Die("Evict with tail blocks (int4_kc)");
  if (s.num_computed != n) {
    Die(absl::StrCat("Evict of sequence ", seq, " with ", n - s.num_computed,
                     " uncomputed tokens"));
  }
  std::vector<int32_t> v(victims.begin(), victims.end());
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= n || (i > 0 && v[i] == v[i - 1])) {
      Die(absl::StrCat("Evict of entry ", v[i], " of sequence ", seq, " (", n,
                       " entries; each named once)"));
    }
  }
  EvictResult result;
  if (v.empty()) return result;
  const int32_t new_len = n - static_cast<int32_t>(v.size());
  if (new_len == 0) Die(absl::StrCat("Evict of every entry of sequence ", seq));
  const int32_t keep_blocks = BlocksFor(new_len);

  // Holes below the new length take the surviving entries past it, both
  // ascending.
  const size_t num_holes = std::lower_bound(v.begin(), v.end(), new_len) - v.begin();
  size_t next_victim = num_holes;
  int32_t src = new_len;
  for (size_t h = 0; h < num_holes; ++h) {
    while (next_victim < v.size() && v[next_victim] == src) {
      ++src;
      ++next_victim;
    }
    result.moves.push_back({src++, v[h]});
  }

  // Blocks written from now on: those receiving moves, and the new partial
  // last block (the next Append writes into it).
  std::vector<int32_t> written;
  for (size_t h = 0; h < num_holes; ++h) {
    const int32_t b = v[h] / bs;
    if (written.empty() || written.back() != b) written.push_back(b);
  }
  if (new_len % bs != 0 && (written.empty() || written.back() != new_len / bs)) {
    written.push_back(new_len / bs);
  }
  int32_t must_copy = 0;
  for (int32_t b : written) must_copy += SeqRefs(s.table.blocks()[b]) > 1 ? 1 : 0;
  if (must_copy > pool_.num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("eviction in sequence ", seq, " must copy ", Blocks(must_copy, "shared "),
                     "; ", pool_.num_free(), " of ", pool_.num_blocks(), " blocks are free"));
  }
  int32_t spare = pool_.num_free() - must_copy;
  for (int32_t b : written) {
    const BlockId id = s.table.blocks()[b];
    const bool shared = SeqRefs(id) > 1;
    if (!shared && !prefix_.contains(id)) continue;
    if (!shared && spare == 0) {
      prefix_.Erase(id);  // ours alone: give up the filing rather than fail
      continue;
    }
    if (!shared) --spare;
    const BlockId copy = AllocateFresh();
    RecordCow(id, copy);
    ReleasePrimary(id);
    s.table.SetBlock(b, copy);
  }

  // The moves read and write these blocks: pinned until the moves are taken,
  // so a source released below is not handed out before it is read.
  for (const IndexMove& m : result.moves) {
    const int64_t from = s.table.SlotOf(m.from), to = s.table.SlotOf(m.to);
    pending_.slot_moves.push_back({from, to});
    PinPrimary(static_cast<BlockId>(from / bs));
    PinPrimary(static_cast<BlockId>(to / bs));
    s.tokens[m.to] = s.tokens[m.from];
  }
  // Tail first, like Free.
  for (int32_t b = s.table.num_blocks() - 1; b >= keep_blocks; --b) {
    ReleasePrimary(s.table.blocks()[b]);
    s.table.PopBlock();
    ++result.freed_blocks;
  }
  s.tokens.resize(new_len);
  s.table.set_num_tokens(new_len);
  s.num_computed = new_len;
  // Leading blocks before the first victim are untouched: they keep their
  // hashes (swap-in may find them cached); nothing after is ever filed.
  s.hashes.resize(std::min<size_t>(s.hashes.size(), v.front() / bs));
  s.evicted = true;
  if (!result.moves.empty()) {
    s.moves_pending = true;
    moves_pending_seqs_.push_back(seq);
  }
  result.num_evicted = static_cast<int32_t>(v.size());
  ++counters_.kv_evictions;
  counters_.kv_evicted_tokens += result.num_evicted;
  counters_.kv_eviction_freed_blocks += result.freed_blocks;
  counters_.kv_eviction_slot_moves += static_cast<int64_t>(result.moves.size());
  return result;
}

}  // namespace kvserve
