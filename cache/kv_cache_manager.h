// KvCacheManager: the KV cache as the scheduler sees it. It owns the primary
// block pool, the host swap pool, one block table per sequence, the prefix
// cache, and the copies the backend must run before the next forward pass.
// Sequences are named by a SeqId the scheduler chooses.
//
// Protocol, once per engine step:
//   1. plan:     CanAllocate/Allocate new prompts, CanAppend/Append decode
//                tokens, Fork for n > 1, Free finished sequences,
//                SwapOut/SwapIn for preemption. Running out of blocks is a
//                value (ResourceExhausted) with nothing changed, which the
//                scheduler answers with preemption.
//   2. copies:   TakePendingCopies(); run swap_out, then copies, then swap_in
//                (block_copy.h), before the forward pass.
//   3. forward:  BatchInput from block_table()/AppendSlotMapping().
//   4. commit:   MarkComputed(seq, n) once the K/V of tokens [0, n) are
//                written. Only then do full blocks enter the prefix cache, so
//                a hit never names a block a prefill chunk has yet to write.
//
// Copy-on-write: Fork shares every block (ref count + 1). Append, about to
// put tokens into a partial last block that another sequence also holds,
// first moves the sequence to a private copy. Full blocks are never written.
//
// Prefix caching (KvCacheConfig::enable_prefix_caching): a computed full
// block is filed under a hash chained from its parent's hash, its tokens and
// the cache salt (block_hash.h). Allocate reuses the longest chain of filed
// blocks, whether held by running sequences (ref + 1) or free, and always
// leaves at least the last prompt token to compute so the step has logits.
// Freed filed blocks stay reusable in the pool's LRU free list until an
// allocation needs them; Free releases a sequence's tail first, so its tail
// is evicted first.
//
// Why the fixed copy order (swap_out, copies, swap_in, forward) is safe even
// when blocks are freed and reused within one step:
//   * Blocks a pending copy reads or writes are pinned (an extra pool
//     reference, not visible as sharing) until TakePendingCopies, so they are
//     never handed out again in the same step. The one exception is the
//     source of a swap-out, which is freed at once so preemption makes room
//     in the same step; swap-outs run first, before anything can overwrite it.
//   * A copy never reads a block that a pending copy has yet to write: such a
//     read is redirected to the original source (copy-on-write of a block
//     being swapped in becomes a swap-in; swapping out a fresh copy-on-write
//     block copies from its source; swapping out a block still being swapped
//     in simply keeps the host block it came from).
//   * So inside each batch no block is written twice or both read and
//     written, and the forward pass only writes blocks after every copy.
//
// Tail blocks (int4_kc, KvCacheConfig::num_tail_blocks > 0): a sequence's
// partial last block is not written into its block until it fills; its rows
// live in full precision in a tail block from a separate tail pool
// (cache/format/kv_layout.h has the kernels' contract). A resident or swapped
// sequence holds a tail exactly when it has uncomputed tokens (a step may end
// inside a block, whatever the chunking) or its computed or reserved token
// count is not a multiple of block_size (the tail then holds, or may
// receive, rows of a partial block). Tails follow blocks' rules: Fork shares
// the tail (ref count + 1); Append to a sequence whose tail is shared first
// moves it to a private copy (copied only when it holds computed rows); swap
// moves it to a host tail and back; Free releases it.
// Tails never enter the prefix cache (only full, quantized blocks are
// filed). Copies name tails with extended ids: primary ids from num_blocks
// up are tail (id - num_blocks), host ids from num_swap_blocks up are host
// tail (id - num_swap_blocks); the same pins and copy order apply. A partial
// last block that copy-on-write moves is not copied (it holds nothing yet).
//
// Eviction (Evict; which entries is cache/eviction/eviction_policy.h's business): a
// sequence keeps a bounded number of entries by dropping some after a
// forward pass. A hole below the new length is refilled by moving a later
// surviving entry into it (a slot move, StepCopies::slot_moves): attention
// does not depend on the order of entries, since keys are stored with their
// RoPE rotation. Blocks past the new length go back to the pool, tail first.
// A block written afterwards (one receiving a moved entry, and the new
// partial last block, which the next Append fills) is first copied when
// another sequence holds it (copy-on-write) or the prefix cache has it filed
// (so the cached prefix stays intact for later requests; with no free block
// the filing is dropped instead). A sequence that has evicted never files
// blocks again: its chain of hashes no longer describes its blocks. Its
// untouched leading blocks keep their hashes, so swap-in may still take
// them from the cache. The engine drains the slot moves right after the
// evictions of a step (TakePendingCopies), before anything can swap the
// sequence out; swapping out or evicting again a sequence whose moves are
// still pending aborts.
//
// Contract violations (unknown or duplicate SeqId, appending to a swapped
// sequence, forking a sequence with uncomputed tokens, marking computed
// tokens that were never reserved) abort with a message: they are scheduler
// bugs, not load.
//
// Thread-safety: none; the engine thread owns the manager.
//
// Example (block_size 4):
//   KvCacheManager kv({.block_size = 4, .num_blocks = 8});
//   auto r = kv.Allocate(1, prompt);          // r->num_cached_tokens == 0
//   ... step: TakePendingCopies, forward, then kv.MarkComputed(1, prompt.size());
//   kv.Fork(1, 2);                            // shares every block
//   kv.Append(2, {token});                    // copy-on-write of the last block
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/block_copy.h"
#include "cache/block_hash.h"
#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "cache/index_move.h"
#include "cache/kv_cache_stats.h"
#include "cache/kv_tier_hooks.h"
#include "cache/prefix_cache.h"
#include "cache/seq_id.h"
#include "cache/sizing/block_count.h"

namespace kvserve {

struct KvCacheConfig {
  int32_t block_size = 16;      // tokens per block
  int32_t num_blocks = 0;       // primary (device) pool
  int32_t num_swap_blocks = 0;  // host pool for swapped-out sequences; 0: no swap
  bool enable_prefix_caching = true;
  uint64_t hash_seed = 0;  // seeds every hash chain (block_hash.h)
  // int4_kc: full-precision tail blocks for partial blocks (0: the format
  // keeps none), and host tails for swapped-out sequences.
  int32_t num_tail_blocks = 0;
  int32_t num_swap_tail_blocks = 0;
  // With tails: some layers still keep a partial block's rows in the block
  // (per-token layers beside int4_kc ones, cross-layer pairs' plain
  // layers), so copy-on-write of a partial block copies it too.
  bool partial_rows_in_blocks = false;

  // Names the bad field ("cache.block_size must be positive, got 0").
  absl::Status Validate() const;
};

// Evict's result is an EvictResult of IndexMoves (cache/index_move.h): the
// caller's per-entry bookkeeping (eviction statistics) follows them.

struct AllocateResult {
  // Leading prompt tokens whose K/V came from the prefix cache (a multiple of
  // block_size, less than the prompt length): compute from here.
  int32_t num_cached_tokens = 0;
  // Of which loaded from a tier below the device (their bytes arrive with
  // this step's tier loads, before the forward pass).
  int32_t num_tier_tokens = 0;
};

class KvCacheManager {
 public:
  // Aborts if !config.Validate().ok(); validate configs at start-up.
  explicit KvCacheManager(const KvCacheConfig& config);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  const KvCacheConfig& config() const { return config_; }
  int32_t block_size() const { return config_.block_size; }

  // ---- Admission -----------------------------------------------------------
  // Whether Allocate would succeed now (counts prefix hits). It hashes the
  // prompt, as Allocate does again; a scheduler may instead call Allocate and
  // treat ResourceExhausted as "not now".
  bool CanAllocate(std::span<const int32_t> prompt, std::string_view cache_salt = {},
                   bool use_prefix_cache = true) const;
  // Reserves slots for every prompt token, reusing cached prefix blocks.
  // ResourceExhausted (nothing changed) when the pool is short;
  // InvalidArgument for an empty prompt. use_prefix_cache false: the
  // sequence neither reuses nor ever files blocks (one that must compute its
  // whole prompt, e.g. to record the attention each entry gets).
  absl::StatusOr<AllocateResult> Allocate(SeqId seq, std::span<const int32_t> prompt,
                                          std::string_view cache_salt = {},
                                          bool use_prefix_cache = true);
  absl::StatusOr<AllocateResult> Allocate(SeqId seq, std::initializer_list<int32_t> prompt,
                                          std::string_view cache_salt = {}) {
    return Allocate(seq, std::span<const int32_t>(prompt.begin(), prompt.size()), cache_salt);
  }

  // ---- Growth --------------------------------------------------------------
  // Whether Append of num_new_tokens would succeed now (counts the
  // copy-on-write block).
  bool CanAppend(SeqId seq, int32_t num_new_tokens) const;
  // Reserves slots for new tokens (normally the one just sampled), first
  // copying a shared partial last block. ResourceExhausted (nothing changed)
  // when the pool is short.
  absl::Status Append(SeqId seq, std::span<const int32_t> new_token_ids);
  absl::Status Append(SeqId seq, std::initializer_list<int32_t> new_token_ids) {
    return Append(seq, std::span<const int32_t>(new_token_ids.begin(), new_token_ids.size()));
  }
  // The K/V of tokens [0, num_computed_tokens) are written: full blocks among
  // them become prefix-cache entries. Never decreases.
  void MarkComputed(SeqId seq, int32_t num_computed_tokens);

  // ---- Eviction --------------------------------------------------------------
  // Drops the entries at cache indices `victims` (distinct, any order) of a
  // resident sequence whose reserved tokens are all computed, refilling
  // holes by slot moves (see the top comment). ResourceExhausted (nothing
  // changed) when a block shared with another sequence must be copied and
  // the pool has no free block. Aborts on an index outside the sequence,
  // when its previous moves are still pending, or with tails (int4_kc's
  // per-block K scales; the engine refuses eviction there).
  absl::StatusOr<EvictResult> Evict(SeqId seq, std::span<const int32_t> victims);
  // Whether the sequence has ever evicted (it then files nothing).
  bool HasEvicted(SeqId seq) const { return Get(seq).evicted; }

  // ---- Branching and ending ------------------------------------------------
  // `child` shares every block of `parent` (resident, every token computed).
  void Fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks (primary or host), tail first.
  void Free(SeqId seq);

  // ---- Swap (preemption) ---------------------------------------------------
  // A group (e.g. the samples of one request) moves together, so blocks its
  // members share are copied once and stay shared. SwapOut frees the primary
  // blocks at once (filed ones stay cached until evicted). SwapIn takes a
  // block whose K/V are still in the prefix cache without a copy, and files
  // the blocks it copies back in again. ResourceExhausted (nothing changed)
  // when the target pool is short.
  bool CanSwapOut(std::span<const SeqId> seqs) const;
  absl::Status SwapOut(std::span<const SeqId> seqs);
  absl::Status SwapOut(SeqId seq) { return SwapOut(std::span<const SeqId>(&seq, 1)); }
  bool CanSwapIn(std::span<const SeqId> seqs) const;
  absl::Status SwapIn(std::span<const SeqId> seqs);
  absl::Status SwapIn(SeqId seq) { return SwapIn(std::span<const SeqId>(&seq, 1)); }

  // ---- Tiers below the device (cache/kv_tier_hooks.h) ------------------------
  // With a source, Allocate continues a prompt's chain of hashes below the
  // device, and every filed block the pool hands out for new content is
  // recorded as a spill; with write_through every block filed at
  // MarkComputed is recorded too. Null (the default): none of it.
  void set_tier_source(KvTierSource* source, bool write_through = false) {
    tiers_ = source;
    write_through_ = source != nullptr && write_through;
  }
  // Whether a block is filed under `hash` on the device.
  bool IsFiledHash(BlockHash hash) const { return prefix_.ContainsHash(hash); }
  // The spills and loads recorded since the last call: export the spills
  // first in the step, import the loads with the swap-ins.
  TierTransfers TakeTierTransfers() { return std::exchange(tier_pending_, TierTransfers{}); }
  const TierTransfers& pending_tier_transfers() const { return tier_pending_; }

  // ---- Per step ------------------------------------------------------------
  // The copies recorded since the last call, and releases their pins (a
  // block freed while a pending copy names it becomes allocatable here). Run
  // them (in StepCopies order) before the forward pass.
  StepCopies TakePendingCopies();
  const StepCopies& pending_copies() const { return pending_; }

  // ---- Views ---------------------------------------------------------------
  bool Contains(SeqId seq) const { return seqs_.contains(seq); }
  bool IsSwapped(SeqId seq) const { return Get(seq).swapped; }
  // Logical block -> primary id (host ids while swapped).
  const BlockTable& block_table(SeqId seq) const { return Get(seq).table; }
  std::span<const int32_t> token_ids(SeqId seq) const { return Get(seq).tokens; }
  int32_t num_tokens(SeqId seq) const { return Get(seq).table.num_tokens(); }
  int32_t num_computed_tokens(SeqId seq) const { return Get(seq).num_computed; }
  // Appends the slots (block_id * block_size + offset) of token indices
  // [begin, end) of a resident sequence: BatchInput::slot_mapping.
  void AppendSlotMapping(SeqId seq, int32_t begin, int32_t end, std::vector<int64_t>* slots) const;
  // The tail a resident sequence's partial block lives in (0-based, for
  // BatchInput::tail_ids), or -1.
  int32_t tail_id(SeqId seq) const;
  // The sequence's tail as an extended id (primary, or host while swapped),
  // or kNoBlock.
  BlockId tail_block(SeqId seq) const { return Get(seq).tail; }
  bool has_tails() const { return config_.num_tail_blocks > 0; }
  int32_t num_sequences() const { return static_cast<int32_t>(seqs_.size()); }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  // Whether a primary block is filed in the prefix cache.
  bool IsCachedBlock(BlockId id) const {
    return id >= 0 && id < pool_.num_blocks() && prefix_.contains(id);
  }
  const BlockPool& pool() const { return pool_; }
  const BlockPool& swap_pool() const { return swap_pool_; }
  const BlockPool& tail_pool() const { return tail_pool_; }
  const BlockPool& swap_tail_pool() const { return swap_tail_pool_; }
  KvCacheStats Stats() const;

  // Full self-check, O(blocks + tokens): ref counts equal table references
  // plus pins, free lists agree with ref counts, the prefix cache agrees with
  // its map, every table covers its tokens. For tests and debug builds.
  absl::Status CheckInvariants() const;

 private:
  struct SeqState {
    explicit SeqState(int32_t block_size) : table(block_size) {}
    BlockTable table;
    std::vector<int32_t> tokens;
    std::vector<BlockHash> hashes;  // chain hash of each computed full block
    uint64_t extra_key = 0;
    int32_t num_computed = 0;
    bool swapped = false;
    BlockId tail = kNoBlock;     // extended id (primary, or host while swapped)
    bool evicted = false;        // has evicted: files no more blocks
    bool files = true;           // Allocate's use_prefix_cache
    bool moves_pending = false;  // slot moves recorded, not yet taken
  };
  // What a pinned primary block will hold once this step's copies ran.
  enum class Origin : uint8_t { kNone, kCow, kSwapIn };

  const SeqState& Get(SeqId seq) const;
  SeqState& GetResident(SeqId seq, const char* op);
  int32_t BlocksFor(size_t num_tokens) const {
    return BlocksForTokens(num_tokens, config_.block_size);
  }
  int32_t SeqRefs(BlockId id) const { return PrimaryRefCount(id) - primary_pinned_[id]; }
  std::span<const int32_t> BlockTokens(const SeqState& s, int32_t index) const;
  // The cached block holding block `index` of s (a computed full block), or kNoBlock.
  BlockId FindCachedBlock(const SeqState& s, int32_t index) const;
  int32_t FindCachedPrefix(std::span<const int32_t> prompt, uint64_t extra_key,
                           std::vector<BlockId>* hits, std::vector<BlockHash>* hashes) const;
  BlockId AllocateFresh();
  // Extended ids: tails after the blocks in both the primary and host space.
  bool IsTail(BlockId id) const { return id >= pool_.num_blocks(); }
  bool IsHostTail(BlockId id) const { return id >= swap_pool_.num_blocks(); }
  int32_t PrimaryRefCount(BlockId id) const;
  void AddRefPrimary(BlockId id);
  void AddRefHost(BlockId id);
  void ReleaseHost(BlockId id);
  BlockId AllocateTail();
  BlockId AllocateHostTail();
  // Whether a sequence with these token counts holds a tail.
  bool NeedsTail(int32_t num_computed, int32_t num_tokens) const {
    return has_tails() && (num_computed < num_tokens || num_computed % config_.block_size != 0 ||
                           num_tokens % config_.block_size != 0);
  }
  // Tails an Append of num_new_tokens needs from the pool (0 or 1).
  int32_t TailsForAppend(const SeqState& s, int32_t num_new_tokens) const;
  void ReleasePrimary(BlockId id);
  void PinPrimary(BlockId id);
  void PinHost(BlockId id);
  void RecordCow(BlockId src, BlockId dst);
  // Blocks and tails the swap needs from the target pools.
  struct SwapNeed {
    int32_t blocks = 0;
    int32_t tails = 0;
  };
  SwapNeed CountSwapOut(std::span<const SeqId> seqs) const;
  SwapNeed CountSwapIn(std::span<const SeqId> seqs) const;
  void NextMarkEpoch() const;

  KvCacheConfig config_;
  BlockPool pool_;
  BlockPool swap_pool_;
  BlockPool tail_pool_;
  BlockPool swap_tail_pool_;
  PrefixCache prefix_;
  absl::flat_hash_map<SeqId, SeqState> seqs_;
  int32_t num_swapped_seqs_ = 0;
  int32_t num_cached_free_ = 0;  // free primary blocks filed in the prefix cache

  // Per-id arrays span the extended ids (blocks, then tails).
  StepCopies pending_;
  std::vector<uint8_t> primary_pinned_;  // [num_blocks + num_tails] 0/1
  std::vector<uint8_t> host_pinned_;     // [num_swap_blocks + num_swap_tails] 0/1
  std::vector<Origin> origin_;           // [num_blocks + num_tails], kNone unless pinned
  std::vector<BlockId> origin_src_;      // [num_blocks + num_tails]
  std::vector<BlockId> pinned_primary_list_;
  std::vector<BlockId> pinned_host_list_;
  std::vector<SeqId> moves_pending_seqs_;  // sequences with moves in pending_

  // Scratch for swap grouping: block id -> id in the other pool, valid where
  // the stamp equals mark_epoch_ (no clearing between calls).
  mutable uint32_t mark_epoch_ = 0;
  mutable std::vector<uint32_t> primary_mark_;
  mutable std::vector<uint32_t> host_mark_;
  std::vector<BlockId> primary_map_;
  std::vector<BlockId> host_map_;
  mutable std::vector<BlockId> hit_scratch_;
  mutable std::vector<BlockHash> hash_scratch_;

  KvCacheStats counters_;
  KvTierSource* tiers_ = nullptr;
  bool write_through_ = false;
  TierTransfers tier_pending_;
  std::vector<TierHit> tier_hits_;  // scratch
};

}  // namespace kvserve
