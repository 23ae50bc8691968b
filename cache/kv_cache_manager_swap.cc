#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_cache_manager.h"
#include "cache/kv_cache_manager_internal.h"

namespace kvserve {
namespace {

using cache_internal::Blocks;
using cache_internal::CheckNoDuplicates;
using cache_internal::Die;

}  // namespace

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

}  // namespace kvserve
