// TierPrefetch: the state a new request waits in while its prompt's blocks
// come from a slow tier (the disk, the remote tier), so the engine step never
// waits on a pread or the network.
//
// At admission (EngineImpl::Admit) the prompt's chain of block hashes is
// walked past what this node holds in memory (the device pool, the host
// tier, staged loads). The disk blocks that continue it are read by the disk
// tier's loader thread (cache/tier/disk_loader.h), and what still follows is
// asked of the remote tier's worker (cache/tier/remote_tier.h); while either
// is out, the sequence is held here instead of entering the scheduler's
// waiting queue: it holds no KV blocks, is not running and takes no part in
// a step. Each loop iteration Poll hands back the sequences whose loads were
// answered (their checked blocks staged in KvTiers, where Allocate's Find
// takes them; the step's one batched ImportBlocks then copies them into
// device blocks before the prefill) or ran past cache.tier_load_timeout_ms
// (what was not answered is abandoned, counted per tier as a timeout and
// recomputed; one log line per 10 s at most). A held sequence that ends
// (cancelled, client gone, draining) is forgotten by Cancel.
//
// Host-tier blocks are not loaded here: a host hit is a lookup, and its
// bytes move in the same batched import as any other load.
//
// Only a request's first admission is held; preempted sequences go back to
// the scheduler as before (their disk blocks are then misses). Policies
// that skip the prefix cache skip this too.
//
// Thread-safety: engine thread only (the loaders are thread-safe).
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

  // True when the sequence waits here for a disk or remote load.
  bool MaybeHold(Sequence* seq);
  // Appends the sequences ready for the scheduler, in the order they were held.
  void Poll(std::vector<Sequence*>* ready);
  // Forgets a held sequence (status finished); false when it is not held.
  bool Cancel(Sequence* seq);
  bool empty() const { return held_.empty(); }
  int64_t size() const { return static_cast<int64_t>(held_.size()); }
  // Sleeps until a load is answered, at most timeout_ms (the engine loop
  // when nothing else runs).
  void Wait(int timeout_ms);

 private:
  struct Held {
    Sequence* seq;
    int64_t start_us;
    uint64_t disk_ticket;                // 0: none or answered
    uint64_t remote_ticket;              // 0: none or answered
    std::vector<DiskLoader::Read> disk;  // the disk reads, in chain order
    std::vector<BlockHash> remote;       // the blocks asked of Redis, in chain order
  };
  void Abandon(Held& h, bool count_timeouts);
  void LogTimeouts(int64_t now_us);

  KvTiers* tiers_;
  const KvCacheManager* kv_;
  int32_t timeout_ms_;
  std::vector<Held> held_;
  std::vector<RemoteTier::BlockResult> results_;  // scratch
  std::vector<DiskLoader::Result> disk_results_;  // scratch
  int64_t unlogged_timeouts_ = 0;
  int64_t last_log_us_ = 0;
};

}  // namespace kvserve
