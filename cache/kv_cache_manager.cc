#include "cache/kv_cache_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "KvCacheManager invariant broken: %s\n", what.c_str());
  std::abort();
}

void CheckNoDuplicates(std::span<const SeqId> seqs, const char* op) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t j = i + 1; j < seqs.size(); ++j) {
      if (seqs[i] == seqs[j]) Die(absl::StrCat(op, " names sequence ", seqs[i], " twice"));
    }
  }
}

// "1 block", "2 blocks".
std::string Blocks(int64_t n, const char* kind = "") {
  return absl::StrCat(n, " ", kind, n == 1 ? "block" : "blocks");
}

const KvCacheConfig& ValidOrDie(const KvCacheConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) Die(std::string(s.message()));
  return config;
}

}  // namespace

absl::Status KvCacheConfig::Validate() const {
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.block_size must be positive, got ", block_size));
  }
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_blocks must be positive, got ", num_blocks));
  }
  if (num_swap_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_swap_blocks must not be negative, got ", num_swap_blocks));
  }
  if (num_tail_blocks < 0 || num_swap_tail_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cache tail blocks must not be negative, got ",
                                                   num_tail_blocks, " and ", num_swap_tail_blocks));
  }
  return absl::OkStatus();
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(ValidOrDie(config)),
      pool_(config_.num_blocks),
      swap_pool_(config_.num_swap_blocks),
      tail_pool_(config_.num_tail_blocks),
      swap_tail_pool_(config_.num_tail_blocks > 0 ? config_.num_swap_tail_blocks : 0),
      prefix_(pool_.num_blocks(), config.block_size),
      primary_pinned_(pool_.num_blocks() + tail_pool_.num_blocks(), 0),
      host_pinned_(swap_pool_.num_blocks() + swap_tail_pool_.num_blocks(), 0),
      origin_(primary_pinned_.size(), Origin::kNone),
      origin_src_(primary_pinned_.size(), kNoBlock),
      primary_mark_(primary_pinned_.size(), 0),
      host_mark_(host_pinned_.size(), 0),
      primary_map_(primary_pinned_.size(), kNoBlock),
      host_map_(host_pinned_.size(), kNoBlock) {}

// ---- Helpers ----------------------------------------------------------------

const KvCacheManager::SeqState& KvCacheManager::Get(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) Die(absl::StrCat("unknown sequence ", seq));
  return it->second;
}

KvCacheManager::SeqState& KvCacheManager::GetResident(SeqId seq, const char* op) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) Die(absl::StrCat(op, " of unknown sequence ", seq));
  if (it->second.swapped) Die(absl::StrCat(op, " of swapped-out sequence ", seq));
  return it->second;
}

BlockId KvCacheManager::AllocateFresh() {
  std::optional<BlockId> id = pool_.Allocate();
  if (!id) Die("allocation from an empty pool (capacity was checked)");
  if (prefix_.contains(*id)) {
    // The LRU cached block gives up its prefix for new content; with tiers
    // its bytes go down one (exported before anything writes the block).
    if (tiers_ != nullptr) {
      tier_pending_.spills.push_back(
          {*id, prefix_.hash(*id), prefix_.parent(*id), prefix_.extra_key(*id)});
      std::span<const int32_t> t = prefix_.tokens(*id);
      tier_pending_.spill_tokens.insert(tier_pending_.spill_tokens.end(), t.begin(), t.end());
    }
    prefix_.Erase(*id);
    --num_cached_free_;
    ++counters_.evicted_cached_blocks;
  }
  return *id;
}

void KvCacheManager::ReleasePrimary(BlockId id) {
  if (IsTail(id)) {
    tail_pool_.Release(id - pool_.num_blocks());
  } else if (pool_.Release(id) && prefix_.contains(id)) {
    ++num_cached_free_;
  }
}

int32_t KvCacheManager::PrimaryRefCount(BlockId id) const {
  return IsTail(id) ? tail_pool_.ref_count(id - pool_.num_blocks()) : pool_.ref_count(id);
}

void KvCacheManager::AddRefPrimary(BlockId id) {
  if (IsTail(id)) {
    tail_pool_.AddRef(id - pool_.num_blocks());
  } else {
    pool_.AddRef(id);
  }
}

void KvCacheManager::AddRefHost(BlockId id) {
  if (IsHostTail(id)) {
    swap_tail_pool_.AddRef(id - swap_pool_.num_blocks());
  } else {
    swap_pool_.AddRef(id);
  }
}

void KvCacheManager::ReleaseHost(BlockId id) {
  if (IsHostTail(id)) {
    swap_tail_pool_.Release(id - swap_pool_.num_blocks());
  } else {
    swap_pool_.Release(id);
  }
}

BlockId KvCacheManager::AllocateTail() {
  std::optional<BlockId> id = tail_pool_.Allocate();
  if (!id) Die("tail allocation from an empty tail pool (capacity was checked)");
  return pool_.num_blocks() + *id;
}

BlockId KvCacheManager::AllocateHostTail() {
  std::optional<BlockId> id = swap_tail_pool_.Allocate();
  if (!id) Die("host tail allocation from an empty pool (capacity was checked)");
  return swap_pool_.num_blocks() + *id;
}

int32_t KvCacheManager::TailsForAppend(const SeqState& s, int32_t num_new_tokens) const {
  const int32_t after = s.table.num_tokens() + num_new_tokens;
  if (!NeedsTail(s.num_computed, after)) return 0;
  if (s.tail == kNoBlock) return 1;
  return SeqRefs(s.tail) > 1 && num_new_tokens > 0 ? 1 : 0;  // copy-on-write
}

void KvCacheManager::PinPrimary(BlockId id) {
  if (primary_pinned_[id]) return;
  primary_pinned_[id] = 1;
  AddRefPrimary(id);
  pinned_primary_list_.push_back(id);
}

void KvCacheManager::PinHost(BlockId id) {
  if (host_pinned_[id]) return;
  host_pinned_[id] = 1;
  AddRefHost(id);
  pinned_host_list_.push_back(id);
}

void KvCacheManager::RecordCow(BlockId src, BlockId dst) {
  ++counters_.cow_copies;
  if (origin_[src] == Origin::kSwapIn) {
    // src itself is still arriving from the host: copy from there instead.
    const BlockId host = origin_src_[src];
    pending_.swap_in.push_back({host, dst});
    origin_[dst] = Origin::kSwapIn;
    origin_src_[dst] = host;
  } else {
    // (src is a pending copy-on-write destination only if its owner forked
    // before computing its new tokens, which Fork forbids; kept so the batch
    // stays independent whatever the caller does.)
    const BlockId from = origin_[src] == Origin::kCow ? origin_src_[src] : src;
    pending_.copies.push_back({from, dst});
    PinPrimary(from);
    origin_[dst] = Origin::kCow;
    origin_src_[dst] = from;
  }
  PinPrimary(dst);
}

void KvCacheManager::NextMarkEpoch() const {
  if (++mark_epoch_ == 0) {
    std::fill(primary_mark_.begin(), primary_mark_.end(), 0);
    std::fill(host_mark_.begin(), host_mark_.end(), 0);
    mark_epoch_ = 1;
  }
}

std::span<const int32_t> KvCacheManager::BlockTokens(const SeqState& s, int32_t index) const {
  return std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(index) * config_.block_size,
                                                    config_.block_size);
}

BlockId KvCacheManager::FindCachedBlock(const SeqState& s, int32_t index) const {
  if (index >= static_cast<int32_t>(s.hashes.size())) return kNoBlock;
  const BlockHash parent = index == 0 ? config_.hash_seed : s.hashes[index - 1];
  return prefix_.Find(s.hashes[index], parent, s.extra_key, BlockTokens(s, index));
}

int32_t KvCacheManager::FindCachedPrefix(std::span<const int32_t> prompt, uint64_t extra_key,
                                         std::vector<BlockId>* hits,
                                         std::vector<BlockHash>* hashes) const {
  hits->clear();
  hashes->clear();
  if (!config_.enable_prefix_caching) return 0;
  const int32_t bs = config_.block_size;
  // At least the last prompt token is computed, so the step yields logits.
  const int32_t candidates = (static_cast<int32_t>(prompt.size()) - 1) / bs;
  BlockHash parent = config_.hash_seed;
  int32_t num_free = 0;
  for (int32_t i = 0; i < candidates; ++i) {
    std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash h = HashBlock(parent, extra_key, tokens);
    const BlockId id = prefix_.Find(h, parent, extra_key, tokens);
    if (id == kNoBlock) break;
    hits->push_back(id);
    hashes->push_back(h);
    if (pool_.is_free(id)) ++num_free;
    parent = h;
  }
  return num_free;
}

// ---- Admission --------------------------------------------------------------

bool KvCacheManager::CanAllocate(std::span<const int32_t> prompt, std::string_view cache_salt,
                                 bool use_prefix_cache) const {
  if (prompt.empty()) return false;
  const int32_t hit_free = use_prefix_cache ? FindCachedPrefix(prompt, HashCacheSalt(cache_salt),
                                                               &hit_scratch_, &hash_scratch_)
                                            : (hit_scratch_.clear(), 0);
  const int32_t total = BlocksFor(prompt.size());
  const int32_t tails = has_tails() ? 1 : 0;  // a prompt always has tokens to compute
  return total - static_cast<int32_t>(hit_scratch_.size()) + hit_free <= pool_.num_free() &&
         tails <= tail_pool_.num_free();
}

absl::StatusOr<AllocateResult> KvCacheManager::Allocate(SeqId seq, std::span<const int32_t> prompt,
                                                        std::string_view cache_salt,
                                                        bool use_prefix_cache) {
  if (seqs_.contains(seq)) Die(absl::StrCat("Allocate of existing sequence ", seq));
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " has an empty prompt"));
  }
  const uint64_t extra_key = HashCacheSalt(cache_salt);
  int32_t hit_free = 0;
  if (use_prefix_cache) {
    hit_free = FindCachedPrefix(prompt, extra_key, &hit_scratch_, &hash_scratch_);
  } else {
    hit_scratch_.clear();
    hash_scratch_.clear();
  }
  const int32_t num_hits = static_cast<int32_t>(hit_scratch_.size());
  const int32_t total = BlocksFor(prompt.size());
  const int32_t needed = total - num_hits + hit_free;
  if (needed > pool_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", prompt.size(), " tokens needs ", Blocks(total), " (", num_hits, " cached, ",
        needed, " to take); ", pool_.num_free(), " of ", pool_.num_blocks(), " blocks are free"));
  }
  const bool tail = NeedsTail(num_hits * config_.block_size, static_cast<int32_t>(prompt.size()));
  if (tail && tail_pool_.num_free() == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("prompt of ", prompt.size(),
                                                     " tokens needs a tail block; all ",
                                                     tail_pool_.num_blocks(), " are taken"));
  }

  // Past the device the chain may go on in a lower tier: those blocks need
  // fresh device blocks like any other, so the capacity check above holds.
  tier_hits_.clear();
  if (tiers_ != nullptr && use_prefix_cache && config_.enable_prefix_caching) {
    const int32_t bs = config_.block_size;
    const int32_t candidates = (static_cast<int32_t>(prompt.size()) - 1) / bs;
    BlockHash parent = hash_scratch_.empty() ? config_.hash_seed : hash_scratch_.back();
    for (int32_t i = num_hits; i < candidates; ++i) {
      std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(i) * bs, bs);
      const BlockHash h = HashBlock(parent, extra_key, tokens);
      TierHit hit = tiers_->Find({h, parent, extra_key, tokens});
      if (!hit) break;
      tier_hits_.push_back(std::move(hit));
      hash_scratch_.push_back(h);
      parent = h;
    }
  }
  const int32_t num_tier = static_cast<int32_t>(tier_hits_.size());

  SeqState state(config_.block_size);
  // Hits first: taking them off the free list keeps the allocations below
  // from evicting them.
  for (BlockId id : hit_scratch_) {
    if (pool_.is_free(id)) {
      pool_.Take(id);
      --num_cached_free_;
    } else {
      pool_.AddRef(id);
    }
    state.table.AppendBlock(id);
  }
  for (int32_t i = 0; i < num_tier; ++i) {
    const int32_t index = num_hits + i;
    const BlockId id = AllocateFresh();
    state.table.AppendBlock(id);
    tier_pending_.loads.push_back({id, std::move(tier_hits_[i])});
    // Filed now, as SwapIn files what it copies in: the bytes land before
    // the forward pass that could read them.
    const BlockHash h = hash_scratch_[index];
    if (!prefix_.ContainsHash(h)) {
      prefix_.Insert(
          id, h, index == 0 ? config_.hash_seed : hash_scratch_[index - 1], extra_key,
          prompt.subspan(static_cast<size_t>(index) * config_.block_size, config_.block_size));
    }
  }
  tier_hits_.clear();
  for (int32_t i = num_hits + num_tier; i < total; ++i) state.table.AppendBlock(AllocateFresh());
  state.tokens.assign(prompt.begin(), prompt.end());
  state.table.set_num_tokens(static_cast<int32_t>(prompt.size()));
  state.hashes = hash_scratch_;
  state.extra_key = extra_key;
  state.num_computed = (num_hits + num_tier) * config_.block_size;
  state.files = use_prefix_cache;
  if (tail) state.tail = AllocateTail();
  seqs_.emplace(seq, std::move(state));

  if (config_.enable_prefix_caching && use_prefix_cache) {
    ++counters_.prefix_queries;
    counters_.prefix_query_tokens += static_cast<int64_t>(prompt.size());
    counters_.prefix_hit_tokens += static_cast<int64_t>(num_hits) * config_.block_size;
    counters_.tier_hit_tokens += static_cast<int64_t>(num_tier) * config_.block_size;
  }
  return AllocateResult{(num_hits + num_tier) * config_.block_size, num_tier * config_.block_size};
}

// ---- Growth -----------------------------------------------------------------

bool KvCacheManager::CanAppend(SeqId seq, int32_t num_new_tokens) const {
  const SeqState& s = Get(seq);
  if (s.swapped) Die(absl::StrCat("CanAppend of swapped-out sequence ", seq));
  if (num_new_tokens <= 0) return true;
  const int32_t cur = s.table.num_tokens();
  const bool cow = cur % config_.block_size != 0 && SeqRefs(s.table.blocks().back()) > 1;
  const int32_t needed =
      BlocksFor(static_cast<size_t>(cur) + num_new_tokens) - s.table.num_blocks() + (cow ? 1 : 0);
  return needed <= pool_.num_free() && TailsForAppend(s, num_new_tokens) <= tail_pool_.num_free();
}

absl::Status KvCacheManager::Append(SeqId seq, std::span<const int32_t> new_token_ids) {
  SeqState& s = GetResident(seq, "Append");
  if (new_token_ids.empty()) return absl::OkStatus();
  const int32_t cur = s.table.num_tokens();
  const int32_t new_blocks = BlocksFor(cur + new_token_ids.size()) - s.table.num_blocks();
  const bool cow = cur % config_.block_size != 0 && SeqRefs(s.table.blocks().back()) > 1;
  const int32_t needed = new_blocks + (cow ? 1 : 0);
  if (needed > pool_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sequence ", seq, " needs ", Blocks(needed, "more "), cow ? " (one copy-on-write)" : "",
        "; ", pool_.num_free(), " of ", pool_.num_blocks(), " blocks are free"));
  }
  const int32_t new_tokens = static_cast<int32_t>(new_token_ids.size());
  if (TailsForAppend(s, new_tokens) > tail_pool_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq, " needs a tail block; all ",
                                                     tail_pool_.num_blocks(), " are taken"));
  }
  if (cow) {
    const int32_t last = s.table.num_blocks() - 1;
    const BlockId shared = s.table.blocks()[last];
    const BlockId copy = AllocateFresh();
    // With tails the partial block's rows are in the tail, not in it.
    if (!has_tails()) RecordCow(shared, copy);
    ReleasePrimary(shared);
    s.table.SetBlock(last, copy);
  }
  for (int32_t i = 0; i < new_blocks; ++i) s.table.AppendBlock(AllocateFresh());
  const int32_t after = cur + new_tokens;
  if (!NeedsTail(s.num_computed, after)) {
    if (s.tail != kNoBlock) ReleasePrimary(s.tail);
    s.tail = kNoBlock;
  } else if (s.tail == kNoBlock) {
    s.tail = AllocateTail();
  } else if (SeqRefs(s.tail) > 1) {
    // Copy-on-write of the tail; its rows matter only when it holds computed ones.
    const BlockId copy = AllocateTail();
    if (s.num_computed % config_.block_size != 0) RecordCow(s.tail, copy);
    ReleasePrimary(s.tail);
    s.tail = copy;
  }
  s.tokens.insert(s.tokens.end(), new_token_ids.begin(), new_token_ids.end());
  s.table.set_num_tokens(static_cast<int32_t>(s.tokens.size()));
  return absl::OkStatus();
}

void KvCacheManager::MarkComputed(SeqId seq, int32_t num_computed_tokens) {
  SeqState& s = GetResident(seq, "MarkComputed");
  if (num_computed_tokens > s.table.num_tokens() || num_computed_tokens < s.num_computed) {
    Die(absl::StrCat("MarkComputed(", seq, ", ", num_computed_tokens, ") with ", s.num_computed,
                     " computed of ", s.table.num_tokens(), " reserved"));
  }
  s.num_computed = num_computed_tokens;
  if (s.tail != kNoBlock && !NeedsTail(s.num_computed, s.table.num_tokens())) {
    ReleasePrimary(s.tail);
    s.tail = kNoBlock;
  }
  if (!config_.enable_prefix_caching || s.evicted || !s.files) return;
  const int32_t bs = config_.block_size;
  const int32_t full = num_computed_tokens / bs;
  BlockHash parent = s.hashes.empty() ? config_.hash_seed : s.hashes.back();
  for (int32_t i = static_cast<int32_t>(s.hashes.size()); i < full; ++i) {
    std::span<const int32_t> tokens = BlockTokens(s, i);
    const BlockHash h = HashBlock(parent, s.extra_key, tokens);
    s.hashes.push_back(h);
    const BlockId id = s.table.blocks()[i];
    // A block another sequence also holds was filed (or not) by whoever
    // computed it; the same content computed twice stays private (Insert
    // refuses a taken hash).
    // No path reaches here with a shared block today, so no test can tell
    // SeqRefs(id) == 1 from >= 1. Prefix hits and swap-ins that find a
    // cached block take indices below the chain of hashes. Past the chain,
    // sharing starts only at Fork (swap keeps a group's sharing as it was),
    // and Fork requires every token computed, so the parent's full blocks
    // are already hashed (a sequence that does not file or has evicted
    // returned above): only a partial last block is shared, and Append moves
    // a sequence off it before writing (copy-on-write), so it is private
    // by the time it is full. Should that change, the check still leaves a
    // shared block's filing to whoever computed it.
    if (!prefix_.contains(id) && SeqRefs(id) == 1 &&
        prefix_.Insert(id, h, parent, s.extra_key, tokens) && write_through_) {
      tier_pending_.writes.push_back({id, h, parent, s.extra_key});
      tier_pending_.write_tokens.insert(tier_pending_.write_tokens.end(), tokens.begin(),
                                        tokens.end());
    }
    parent = h;
  }
}

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

// ---- Branching and ending ---------------------------------------------------

void KvCacheManager::Fork(SeqId parent, SeqId child) {
  if (seqs_.contains(child)) Die(absl::StrCat("Fork into existing sequence ", child));
  const SeqState& p = GetResident(parent, "Fork");
  if (p.num_computed != p.table.num_tokens()) {
    Die(absl::StrCat("Fork of sequence ", parent, " with ", p.table.num_tokens() - p.num_computed,
                     " uncomputed tokens (both would write their slots)"));
  }
  SeqState copy = p;
  for (BlockId id : copy.table.blocks()) pool_.AddRef(id);
  if (copy.tail != kNoBlock) AddRefPrimary(copy.tail);
  // Pending slot moves write blocks the child now shares: it waits for them
  // too.
  if (copy.moves_pending) moves_pending_seqs_.push_back(child);
  seqs_.emplace(child, std::move(copy));
}

void KvCacheManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) Die(absl::StrCat("Free of unknown sequence ", seq, " (double free?)"));
  const SeqState& s = it->second;
  const std::vector<BlockId>& blocks = s.table.blocks();
  // Tail first: the tail enters the LRU list first, so it is evicted first.
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (s.swapped) {
      swap_pool_.Release(*b);
    } else {
      ReleasePrimary(*b);
    }
  }
  if (s.tail != kNoBlock) {
    if (s.swapped) {
      ReleaseHost(s.tail);
    } else {
      ReleasePrimary(s.tail);
    }
  }
  if (s.swapped) --num_swapped_seqs_;
  seqs_.erase(it);
}

// ---- Swap -------------------------------------------------------------------

KvCacheManager::SwapNeed KvCacheManager::CountSwapOut(std::span<const SeqId> seqs) const {
  NextMarkEpoch();
  SwapNeed need;
  for (SeqId seq : seqs) {
    const SeqState& s = Get(seq);
    if (s.swapped) Die(absl::StrCat("SwapOut of swapped-out sequence ", seq));
    auto count = [&](BlockId id) {
      if (primary_mark_[id] == mark_epoch_) return;
      primary_mark_[id] = mark_epoch_;
      // A block still arriving from the host goes back to that host block.
      if (origin_[id] != Origin::kSwapIn) ++(IsTail(id) ? need.tails : need.blocks);
    };
    for (BlockId id : s.table.blocks()) count(id);
    if (s.tail != kNoBlock) count(s.tail);
  }
  return need;
}

KvCacheManager::SwapNeed KvCacheManager::CountSwapIn(std::span<const SeqId> seqs) const {
  NextMarkEpoch();
  SwapNeed need;
  for (SeqId seq : seqs) {
    const SeqState& s = Get(seq);
    if (!s.swapped) Die(absl::StrCat("SwapIn of resident sequence ", seq));
    for (int32_t i = 0; i < s.table.num_blocks(); ++i) {
      const BlockId h = s.table.blocks()[i];
      if (host_mark_[h] == mark_epoch_) continue;
      host_mark_[h] = mark_epoch_;
      const BlockId cached = FindCachedBlock(s, i);
      if (cached == kNoBlock || pool_.is_free(cached)) ++need.blocks;
    }
    if (s.tail != kNoBlock && host_mark_[s.tail] != mark_epoch_) {
      host_mark_[s.tail] = mark_epoch_;
      ++need.tails;
    }
  }
  return need;
}

bool KvCacheManager::CanSwapOut(std::span<const SeqId> seqs) const {
  CheckNoDuplicates(seqs, "CanSwapOut");
  const SwapNeed need = CountSwapOut(seqs);
  return need.blocks <= swap_pool_.num_free() && need.tails <= swap_tail_pool_.num_free();
}

bool KvCacheManager::CanSwapIn(std::span<const SeqId> seqs) const {
  CheckNoDuplicates(seqs, "CanSwapIn");
  const SwapNeed need = CountSwapIn(seqs);
  return need.blocks <= pool_.num_free() && need.tails <= tail_pool_.num_free();
}

absl::Status KvCacheManager::SwapOut(std::span<const SeqId> seqs) {
  CheckNoDuplicates(seqs, "SwapOut");
  const SwapNeed need = CountSwapOut(seqs);
  if (need.blocks > swap_pool_.num_free() || need.tails > swap_tail_pool_.num_free()) {
    std::string tails;
    if (has_tails()) {
      tails = absl::StrCat(" (and ", need.tails, " of ", swap_tail_pool_.num_free(), " free of ",
                           swap_tail_pool_.num_blocks(), " host tails)");
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "swap-out of ", seqs.size(), " sequence(s) needs ", Blocks(need.blocks, "host "), "; ",
        swap_pool_.num_free(), " of ", swap_pool_.num_blocks(), " are free", tails));
  }
  NextMarkEpoch();
  // The host id that primary block (or tail) p goes to.
  auto swap_out = [&](BlockId p) {
    BlockId h;
    if (primary_mark_[p] == mark_epoch_) {
      h = primary_map_[p];  // shared inside the group: copied once
      AddRefHost(h);
    } else if (origin_[p] == Origin::kSwapIn) {
      h = origin_src_[p];  // pinned, still holds exactly what p will hold
      AddRefHost(h);
    } else {
      h = IsTail(p) ? AllocateHostTail() : *swap_pool_.Allocate();
      const BlockId from = origin_[p] == Origin::kCow ? origin_src_[p] : p;
      pending_.swap_out.push_back({from, h});
      PinHost(h);
      ++counters_.swapped_out_blocks;
    }
    primary_mark_[p] = mark_epoch_;
    primary_map_[p] = h;
    return h;
  };
  std::vector<BlockId>& host_ids = hit_scratch_;
  for (SeqId seq : seqs) {
    SeqState& s = GetResident(seq, "SwapOut");
    if (s.moves_pending) Die(absl::StrCat("SwapOut of sequence ", seq, " with slot moves pending"));
    host_ids.clear();
    for (BlockId p : s.table.blocks()) host_ids.push_back(swap_out(p));
    // Tail first, like Free: cached blocks among them are evicted tail first.
    for (int32_t i = s.table.num_blocks() - 1; i >= 0; --i) {
      ReleasePrimary(s.table.blocks()[i]);
      s.table.SetBlock(i, host_ids[i]);
    }
    if (s.tail != kNoBlock) {
      const BlockId h = swap_out(s.tail);
      ReleasePrimary(s.tail);
      s.tail = h;
    }
    s.swapped = true;
    ++num_swapped_seqs_;
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::SwapIn(std::span<const SeqId> seqs) {
  CheckNoDuplicates(seqs, "SwapIn");
  const SwapNeed need = CountSwapIn(seqs);
  if (need.blocks > pool_.num_free() || need.tails > tail_pool_.num_free()) {
    std::string tails;
    if (has_tails()) {
      tails = absl::StrCat(" (and ", need.tails, " of ", tail_pool_.num_free(), " free of ",
                           tail_pool_.num_blocks(), " tails)");
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("swap-in of ", seqs.size(), " sequence(s) needs ", Blocks(need.blocks), "; ",
                     pool_.num_free(), " of ", pool_.num_blocks(), " are free", tails));
  }
  NextMarkEpoch();
  // A fresh primary block (or tail) that host block h is copied into.
  auto copy_in = [&](BlockId h, BlockId p) {
    pending_.swap_in.push_back({h, p});
    PinPrimary(p);
    PinHost(h);
    origin_[p] = Origin::kSwapIn;
    origin_src_[p] = h;
    ++counters_.swapped_in_blocks;
  };
  std::vector<BlockId>& primary_ids = hit_scratch_;
  for (SeqId seq : seqs) {
    SeqState& s = seqs_.find(seq)->second;
    primary_ids.clear();
    for (int32_t i = 0; i < s.table.num_blocks(); ++i) {
      const BlockId h = s.table.blocks()[i];
      BlockId p;
      if (host_mark_[h] == mark_epoch_) {
        p = host_map_[h];  // shared inside the group: one primary block
        pool_.AddRef(p);
      } else if (p = FindCachedBlock(s, i); p != kNoBlock) {
        // The block's content is still cached on the device: no copy.
        if (pool_.is_free(p)) {
          pool_.Take(p);
          --num_cached_free_;
        } else {
          pool_.AddRef(p);
        }
      } else {
        p = AllocateFresh();
        copy_in(h, p);
        // File it again (its content lands before the forward pass that
        // could read it), unless the hash has another block by now or the
        // sequence has evicted (it files nothing).
        if (!s.evicted && s.files && i < static_cast<int32_t>(s.hashes.size()) &&
            !prefix_.ContainsHash(s.hashes[i])) {
          prefix_.Insert(p, s.hashes[i], i == 0 ? config_.hash_seed : s.hashes[i - 1], s.extra_key,
                         BlockTokens(s, i));
        }
      }
      if (host_mark_[h] != mark_epoch_) {
        host_mark_[h] = mark_epoch_;
        host_map_[h] = p;
      }
      primary_ids.push_back(p);
    }
    for (int32_t i = s.table.num_blocks() - 1; i >= 0; --i) {
      swap_pool_.Release(s.table.blocks()[i]);
      s.table.SetBlock(i, primary_ids[i]);
    }
    if (s.tail != kNoBlock) {
      const BlockId h = s.tail;
      BlockId p;
      if (host_mark_[h] == mark_epoch_) {
        p = host_map_[h];  // a tail the group shares
        AddRefPrimary(p);
      } else {
        p = AllocateTail();
        copy_in(h, p);
        host_mark_[h] = mark_epoch_;
        host_map_[h] = p;
      }
      ReleaseHost(h);
      s.tail = p;
    }
    s.swapped = false;
    --num_swapped_seqs_;
  }
  return absl::OkStatus();
}

// ---- Per step ---------------------------------------------------------------

StepCopies KvCacheManager::TakePendingCopies() {
  StepCopies out = std::exchange(pending_, StepCopies{});
  for (BlockId id : pinned_primary_list_) {
    primary_pinned_[id] = 0;
    origin_[id] = Origin::kNone;
    origin_src_[id] = kNoBlock;
    ReleasePrimary(id);
  }
  pinned_primary_list_.clear();
  for (BlockId id : pinned_host_list_) {
    host_pinned_[id] = 0;
    ReleaseHost(id);
  }
  pinned_host_list_.clear();
  for (SeqId seq : moves_pending_seqs_) {
    if (auto it = seqs_.find(seq); it != seqs_.end()) it->second.moves_pending = false;
  }
  moves_pending_seqs_.clear();
  return out;
}

// ---- Views ------------------------------------------------------------------

void KvCacheManager::AppendSlotMapping(SeqId seq, int32_t begin, int32_t end,
                                       std::vector<int64_t>* slots) const {
  const SeqState& s = Get(seq);
  if (s.swapped || begin < 0 || begin > end || end > s.table.num_tokens()) {
    Die(absl::StrCat("AppendSlotMapping(", seq, ", ", begin, ", ", end, ") of a ",
                     s.swapped ? "swapped-out" : "resident", " sequence of ", s.table.num_tokens(),
                     " tokens"));
  }
  for (int32_t i = begin; i < end; ++i) slots->push_back(s.table.SlotOf(i));
}

int32_t KvCacheManager::tail_id(SeqId seq) const {
  const SeqState& s = Get(seq);
  if (s.swapped) Die(absl::StrCat("tail_id of swapped-out sequence ", seq));
  return s.tail == kNoBlock ? -1 : s.tail - pool_.num_blocks();
}

KvCacheStats KvCacheManager::Stats() const {
  KvCacheStats st = counters_;
  st.num_blocks = pool_.num_blocks();
  st.num_free_blocks = pool_.num_free();
  st.num_active_blocks = pool_.num_used();
  st.num_cached_blocks = num_cached_free_;
  const double total = st.num_blocks > 0 ? st.num_blocks : 1;
  st.active_usage = st.num_active_blocks / total;
  st.usage_with_cached = (st.num_active_blocks + st.num_cached_blocks) / total;
  st.num_swap_blocks = swap_pool_.num_blocks();
  st.num_swap_free_blocks = swap_pool_.num_free();
  st.num_tail_blocks = tail_pool_.num_blocks();
  st.num_free_tail_blocks = tail_pool_.num_free();
  st.num_sequences = static_cast<int32_t>(seqs_.size());
  st.num_swapped_sequences = num_swapped_seqs_;
  return st;
}

absl::Status KvCacheManager::CheckInvariants() const {
  const int32_t bs = config_.block_size;
  // Extended ids: blocks, then tails.
  std::vector<int32_t> refs(primary_pinned_.size(), 0);
  std::vector<int32_t> host_refs(host_pinned_.size(), 0);
  int32_t swapped = 0;
  for (const auto& [seq, s] : seqs_) {
    const BlockTable& t = s.table;
    if (t.block_size() != bs || static_cast<int32_t>(s.tokens.size()) != t.num_tokens() ||
        t.num_blocks() != BlocksFor(s.tokens.size()) || t.num_tokens() == 0) {
      return absl::InternalError(absl::StrCat("sequence ", seq, " has ", t.num_tokens(),
                                              " tokens (", s.tokens.size(), " ids) in ",
                                              t.num_blocks(), " blocks"));
    }
    if (s.num_computed < 0 || s.num_computed > t.num_tokens() ||
        static_cast<int32_t>(s.hashes.size()) > s.num_computed / bs ||
        (!config_.enable_prefix_caching && !s.hashes.empty())) {
      return absl::InternalError(absl::StrCat("sequence ", seq, " has ", s.num_computed,
                                              " computed tokens and ", s.hashes.size(),
                                              " block hashes"));
    }
    if (s.swapped) ++swapped;
    if ((s.tail != kNoBlock) != NeedsTail(s.num_computed, t.num_tokens())) {
      return absl::InternalError(
          absl::StrCat("sequence ", seq, " with ", s.num_computed, " computed of ", t.num_tokens(),
                       " tokens ", s.tail == kNoBlock ? "has no" : "holds a", " tail block"));
    }
    if (s.tail != kNoBlock) {
      const bool ok = s.swapped
                          ? IsHostTail(s.tail) && s.tail < static_cast<int32_t>(host_refs.size())
                          : IsTail(s.tail) && s.tail < static_cast<int32_t>(refs.size());
      if (!ok) return absl::InternalError(absl::StrCat("sequence ", seq, " names tail ", s.tail));
      ++(s.swapped ? host_refs : refs)[s.tail];
    }
    for (int32_t i = 0; i < t.num_blocks(); ++i) {
      const BlockId id = t.blocks()[i];
      const int32_t limit = s.swapped ? swap_pool_.num_blocks() : pool_.num_blocks();
      if (id < 0 || id >= limit) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " names block ", id));
      }
      if (s.swapped) {
        ++host_refs[id];
        continue;
      }
      ++refs[id];
      // After an eviction, blocks past the kept hashes may still be filed:
      // they were never written since (Evict copies or unfiles first).
      const bool past_chain = i >= static_cast<int32_t>(s.hashes.size());
      if (prefix_.contains(id) &&
          ((past_chain && !s.evicted) || (!past_chain && prefix_.hash(id) != s.hashes[i]))) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " holds cached block ", id,
                                                " at index ", i, " under another hash"));
      }
    }
  }
  if (swapped != num_swapped_seqs_) {
    return absl::InternalError(
        absl::StrCat(swapped, " sequences are swapped out, counted ", num_swapped_seqs_));
  }

  // `base`: the pool's first extended id.
  auto check_pool = [](const BlockPool& pool, const std::vector<int32_t>& refs,
                       const std::vector<uint8_t>& pinned, int32_t base,
                       const char* name) -> absl::Status {
    int32_t zero = 0;
    for (BlockId id = 0; id < pool.num_blocks(); ++id) {
      const int32_t expected = refs[base + id] + pinned[base + id];
      if (pool.ref_count(id) != expected) {
        return absl::InternalError(absl::StrCat(
            name, " block ", id, " has ref count ", pool.ref_count(id), "; tables hold ",
            refs[base + id], pinned[base + id] ? " plus a pin" : ""));
      }
      if (expected == 0) ++zero;
    }
    const std::vector<BlockId> free_list = pool.FreeListInOrder();
    if (static_cast<int32_t>(free_list.size()) != pool.num_free() || zero != pool.num_free() ||
        pool.num_free() + pool.num_used() != pool.num_blocks()) {
      return absl::InternalError(absl::StrCat(name, " pool: ", free_list.size(),
                                              " blocks listed free, ", zero, " unreferenced, ",
                                              pool.num_free(), " counted free"));
    }
    for (BlockId id : free_list) {
      if (pool.ref_count(id) != 0) {
        return absl::InternalError(absl::StrCat(name, " block ", id, " is free and used"));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_pool(pool_, refs, primary_pinned_, 0, "primary"); !s.ok()) return s;
  if (absl::Status s = check_pool(swap_pool_, host_refs, host_pinned_, 0, "host"); !s.ok())
    return s;
  if (absl::Status s =
          check_pool(tail_pool_, refs, primary_pinned_, pool_.num_blocks(), "primary tail");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check_pool(swap_tail_pool_, host_refs, host_pinned_, swap_pool_.num_blocks(),
                                  "host tail");
      !s.ok()) {
    return s;
  }

  int32_t cached_free = 0;
  for (BlockId id = 0; id < pool_.num_blocks(); ++id) {
    if (pool_.is_free(id) && prefix_.contains(id)) ++cached_free;
  }
  for (BlockId id = 0; id < static_cast<BlockId>(primary_pinned_.size()); ++id) {
    if (!primary_pinned_[id] && origin_[id] != Origin::kNone) {
      return absl::InternalError(absl::StrCat("unpinned block ", id, " has a pending origin"));
    }
  }
  if (cached_free != num_cached_free_) {
    return absl::InternalError(
        absl::StrCat(cached_free, " free blocks are cached, counted ", num_cached_free_));
  }
  if (!config_.enable_prefix_caching && prefix_.size() != 0) {
    return absl::InternalError("prefix caching is off but blocks are cached");
  }
  return prefix_.CheckConsistent();
}

}  // namespace kvserve
