#include "scheduler/tier_prefetch.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "spdlog/spdlog.h"

namespace kvserve {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr int64_t kLogEveryUs = 10'000'000;  // timeouts: one line per 10 s at most

}  // namespace

bool TierPrefetch::MaybeHold(Sequence* seq) {
  RemoteTier* remote = tiers_->remote();
  DiskLoader* loader = tiers_->disk_loader();
  if ((remote == nullptr && loader == nullptr) || !kv_->config().enable_prefix_caching) {
    return false;
  }
  if (seq->evictor != nullptr && seq->evictor->needs_attention_stats()) return false;
  const int32_t bs = kv_->block_size();
  const std::span<const int32_t> prompt = seq->prompt();
  const int32_t candidates = (static_cast<int32_t>(prompt.size()) - 1) / bs;
  const uint64_t extra_key = HashCacheSalt(seq->request->params.cache_salt);
  BlockHash parent = kv_->config().hash_seed;
  Held h{seq, 0, 0, 0, {}, {}};
  std::vector<RemoteTier::BlockRequest> ask;
  for (int32_t i = 0; i < candidates; ++i) {
    std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash hash = HashBlock(parent, extra_key, tokens);
    const BlockHash prev = std::exchange(parent, hash);
    if (ask.empty()) {
      // What the node holds in memory needs no load; the disk's blocks are
      // read before anything is asked of Redis.
      if (kv_->IsFiledHash(hash) || tiers_->HoldsInMemory(hash)) continue;
      DiskLoader::Read read;
      if (loader != nullptr && tiers_->LocateOnDisk(hash, &read)) {
        read.hash = hash;
        read.parent = prev;
        read.extra_key = extra_key;
        read.tokens.assign(tokens.begin(), tokens.end());
        h.disk.push_back(std::move(read));
        continue;
      }
    }
    if (remote == nullptr) break;  // the chain ends on this node
    ask.push_back({hash, prev, extra_key, std::vector<int32_t>(tokens.begin(), tokens.end())});
    h.remote.push_back(hash);
  }
  if (h.disk.empty() && ask.empty()) return false;
  h.start_us = NowMicros();
  if (!h.disk.empty()) h.disk_ticket = loader->StartLoad(h.disk);
  if (!ask.empty()) h.remote_ticket = remote->StartLoad(std::move(ask));
  held_.push_back(std::move(h));
  return true;
}

void TierPrefetch::Poll(std::vector<Sequence*>* ready) {
  if (held_.empty()) return;
  const int64_t now = NowMicros();
  size_t kept = 0;
  for (size_t i = 0; i < held_.size(); ++i) {
    Held& h = held_[i];
    if (h.disk_ticket != 0 && tiers_->disk_loader()->TakeLoad(h.disk_ticket, &disk_results_)) {
      h.disk_ticket = 0;
      tiers_->SettleDiskLoad(h.disk, disk_results_, now - h.start_us);
    }
    if (h.remote_ticket != 0 && tiers_->remote()->TakeLoad(h.remote_ticket, &results_)) {
      h.remote_ticket = 0;
      tiers_->CountRemoteLoad(now - h.start_us);
      // The chain is usable up to the first miss or refused value.
      for (size_t b = 0; b < results_.size() && results_[b].value != nullptr; ++b) {
        tiers_->AddFetched(h.remote[b], std::move(results_[b].value));
      }
    }
    bool done = h.disk_ticket == 0 && h.remote_ticket == 0;
    if (!done && now - h.start_us > int64_t{timeout_ms_} * 1000) {
      Abandon(h, /*count_timeouts=*/true);  // too slow: recomputed
      done = true;
    }
    if (done) {
      ready->push_back(h.seq);
    } else if (kept++ != i) {
      held_[kept - 1] = std::move(h);  // never onto itself (that empties its vectors)
    }
  }
  held_.resize(kept);
  LogTimeouts(now);
}

void TierPrefetch::Abandon(Held& h, bool count_timeouts) {
  if (h.disk_ticket != 0) {
    tiers_->disk_loader()->AbandonLoad(h.disk_ticket);
    if (count_timeouts) tiers_->CountTimeout(TierKind::kDisk);
    unlogged_timeouts_ += count_timeouts;
  }
  if (h.remote_ticket != 0) {
    tiers_->remote()->AbandonLoad(h.remote_ticket);
    if (count_timeouts) tiers_->CountTimeout(TierKind::kRemote);
    unlogged_timeouts_ += count_timeouts;
  }
  h.disk_ticket = h.remote_ticket = 0;
}

void TierPrefetch::LogTimeouts(int64_t now_us) {
  if (unlogged_timeouts_ == 0 || now_us - last_log_us_ < kLogEveryUs) return;
  spdlog::warn(
      "engine: {} KV tier load(s) ran past cache.tier_load_timeout_ms ({} ms) and were "
      "recomputed instead",
      unlogged_timeouts_, timeout_ms_);
  unlogged_timeouts_ = 0;
  last_log_us_ = now_us;
}

bool TierPrefetch::Cancel(Sequence* seq) {
  auto it = std::find_if(held_.begin(), held_.end(), [seq](const Held& h) { return h.seq == seq; });
  if (it == held_.end()) return false;
  Abandon(*it, /*count_timeouts=*/false);
  held_.erase(it);
  seq->status = SeqStatus::kFinished;
  return true;
}

void TierPrefetch::Wait(int timeout_ms) {
  if (held_.empty()) return;
  // One of the two loaders (a request waits on either; the loop polls both).
  bool remote_out = false;
  for (const Held& h : held_) remote_out |= h.remote_ticket != 0;
  if (remote_out) {
    tiers_->remote()->WaitForLoads(timeout_ms);
  } else {
    tiers_->disk_loader()->WaitForLoads(timeout_ms);
  }
}

}  // namespace kvserve
