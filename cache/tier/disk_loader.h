// DiskLoader: reads a prompt's disk-tier blocks on a worker thread of its
// own, so the engine step never waits on a pread (scheduler/tier_prefetch.h
// holds the request meanwhile).
//
// The engine thread names each block's slot and generation (DiskTier::
// Locate) and queues the reads (StartLoad); the worker reads and checks each
// value (DiskTier::ReadSlot: checksum, identity, hash, parent, salt and token
// ids) and answers with one result per block, in order. TakeLoad hands the
// results back; the caller then settles each with DiskTier::Settle (a slot
// rewritten meanwhile is a miss; a refused one is dropped) before using it.
// A load past its caller's deadline is abandoned (its answer thrown away).
// Reads stop at the first block that fails: the chain ends there.
//
// Thread-safety: every public method may be called from any thread. The
// DiskTier must outlive the loader (it is destroyed first).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/tier/disk_tier.h"

namespace kvserve {

class DiskLoader {
 public:
  struct Read {
    BlockHash hash = 0;
    BlockHash parent = 0;
    uint64_t extra_key = 0;
    std::vector<int32_t> tokens;
    int32_t slot = -1;
    uint64_t generation = 0;
  };
  struct Result {
    std::shared_ptr<const std::string> value;  // null: refused, unread or not reached
    TierReject reject = TierReject::kNone;
  };

  explicit DiskLoader(const DiskTier* disk);
  ~DiskLoader();
  DiskLoader(const DiskLoader&) = delete;
  DiskLoader& operator=(const DiskLoader&) = delete;

  uint64_t StartLoad(std::vector<Read> reads);
  // True once the load is answered (results moved out, ticket forgotten).
  bool TakeLoad(uint64_t ticket, std::vector<Result>* out);
  void AbandonLoad(uint64_t ticket);
  // Waits up to timeout_ms for any load to be answered.
  void WaitForLoads(int timeout_ms);

 private:
  struct Load {
    uint64_t ticket;
    std::vector<Read> reads;
  };
  void Run();

  const DiskTier* disk_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  std::deque<Load> loads_;
  uint64_t running_ = 0;  // the ticket being read, 0: none
  absl::flat_hash_map<uint64_t, std::vector<Result>> answered_;
  bool abandon_running_ = false;
  uint64_t next_ticket_ = 1;
  std::thread worker_;
};

}  // namespace kvserve
