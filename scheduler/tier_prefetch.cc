#include "scheduler/tier_prefetch.h"

#include <algorithm>
#include <chrono>

namespace kvserve {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool TierPrefetch::MaybeHold(Sequence* seq) {
  RemoteTier* remote = tiers_->remote();
  if (remote == nullptr || !kv_->config().enable_prefix_caching) return false;
  if (seq->evictor != nullptr && seq->evictor->needs_attention_stats()) return false;
  const int32_t bs = kv_->block_size();
  const std::span<const int32_t> prompt = seq->prompt();
  const int32_t candidates = (static_cast<int32_t>(prompt.size()) - 1) / bs;
  const uint64_t extra_key = HashCacheSalt(seq->request->params.cache_salt);
  BlockHash parent = kv_->config().hash_seed;
  std::vector<RemoteTier::BlockRequest> ask;
  std::vector<BlockHash> hashes;
  for (int32_t i = 0; i < candidates; ++i) {
    std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash h = HashBlock(parent, extra_key, tokens);
    // The chain's leading blocks this node holds need no fetch.
    if (ask.empty() && (kv_->IsFiledHash(h) || tiers_->HoldsLocally(h))) {
      parent = h;
      continue;
    }
    ask.push_back({h, parent, extra_key, std::vector<int32_t>(tokens.begin(), tokens.end())});
    hashes.push_back(h);
    parent = h;
  }
  if (ask.empty()) return false;
  const uint64_t ticket = remote->StartLoad(std::move(ask));
  held_.push_back({seq, ticket, NowMicros(), std::move(hashes)});
  return true;
}

void TierPrefetch::Poll(std::vector<Sequence*>* ready) {
  if (held_.empty()) return;
  RemoteTier* remote = tiers_->remote();
  const int64_t now = NowMicros();
  size_t kept = 0;
  for (size_t i = 0; i < held_.size(); ++i) {
    Held& h = held_[i];
    bool done = false;
    if (remote->TakeLoad(h.ticket, &results_)) {
      tiers_->CountRemoteLoad(now - h.start_us);
      // The chain is usable up to the first miss or refused value.
      for (size_t b = 0; b < results_.size() && results_[b].value != nullptr; ++b) {
        tiers_->AddFetched(h.hashes[b], std::move(results_[b].value));
      }
      done = true;
    } else if (now - h.start_us > int64_t{timeout_ms_} * 1000) {
      remote->AbandonLoad(h.ticket);  // too slow: recomputed
      done = true;
    }
    if (done) {
      ready->push_back(h.seq);
    } else if (kept++ != i) {
      held_[kept - 1] = std::move(h);  // never onto itself (that empties its vector)
    }
  }
  held_.resize(kept);
}

bool TierPrefetch::Cancel(Sequence* seq) {
  auto it = std::find_if(held_.begin(), held_.end(), [seq](const Held& h) { return h.seq == seq; });
  if (it == held_.end()) return false;
  tiers_->remote()->AbandonLoad(it->ticket);
  held_.erase(it);
  seq->status = SeqStatus::kFinished;
  return true;
}

void TierPrefetch::Wait(int timeout_ms) {
  if (!held_.empty()) tiers_->remote()->WaitForLoads(timeout_ms);
}

}  // namespace kvserve
