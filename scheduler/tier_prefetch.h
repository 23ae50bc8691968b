// TierPrefetch: the state a new request waits in while its prompt's blocks
// come from the remote tier, so the engine step never waits on the network.
//
// At admission (EngineImpl::Admit) the prompt's chain of block hashes is
// walked past what this node holds (device, host, disk); if blocks are left
// that could be cached, the remote tier is asked for them in the background
// and the sequence is held here instead of entering the scheduler's waiting
// queue. Each loop iteration Poll hands back the sequences whose load was
// answered (their checked blocks staged in KvTiers, where Allocate's Find
// takes them) or ran past cache.tier_load_timeout_ms (abandoned: the
// prompt is recomputed). A held sequence that ends (cancelled, draining) is
// forgotten by Cancel; it holds no KV blocks.
//
// Only a request's first admission is held; preempted sequences go back to
// the scheduler as before. Policies that skip the prefix cache skip this too.
//
// Thread-safety: engine thread only (RemoteTier is thread-safe).
#pragma once

#include <cstdint>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "cache/tier/kv_tiers.h"
#include "scheduler/sequence.h"

namespace kvserve {

class TierPrefetch {
 public:
  TierPrefetch(KvTiers* tiers, const KvCacheManager* kv, int32_t timeout_ms)
      : tiers_(tiers), kv_(kv), timeout_ms_(timeout_ms) {}

  // True when the sequence waits here for a remote load.
  bool MaybeHold(Sequence* seq);
  // Appends the sequences ready for the scheduler, in the order they were held.
  void Poll(std::vector<Sequence*>* ready);
  // Forgets a held sequence (status finished); false when it is not held.
  bool Cancel(Sequence* seq);
  bool empty() const { return held_.empty(); }
  // Sleeps until a load is answered, at most timeout_ms (the engine loop
  // when nothing else runs).
  void Wait(int timeout_ms);

 private:
  struct Held {
    Sequence* seq;
    uint64_t ticket;
    int64_t start_us;
    std::vector<BlockHash> hashes;  // the blocks asked for, in chain order
  };
  KvTiers* tiers_;
  const KvCacheManager* kv_;
  int32_t timeout_ms_;
  std::vector<Held> held_;
  std::vector<RemoteTier::BlockResult> results_;  // scratch
};

}  // namespace kvserve
