#include "cache/kv_cache_manager.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/kv_cache_manager_internal.h"

namespace kvserve {
namespace {

using cache_internal::Blocks;
using cache_internal::Die;

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
    // With tails the partial block's rows are in the tail, not in it,
    // unless some layers keep no tails.
    if (!has_tails() || config_.partial_rows_in_blocks) RecordCow(shared, copy);
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
