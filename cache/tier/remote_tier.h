// RemoteTier: block values (block_value.h) in a Redis (or Valkey) that every
// replica shares, through hiredis, from one worker thread, so the engine
// thread never waits on the network.
//
// Keys: TierStoreKey("kvserve:", identity, chained hash): the hash covers
// the tokens and the cache salt (the tenant), the identity the model and KV
// format, so no replica of another model or format, and no other tenant,
// names a block of this one. Values are checked on load by the worker
// (checksum, identity, tokens); a refused value is deleted and counted.
//
// The engine thread only queues work and polls:
//   * WriteThrough: a full, computed block; the queue is bounded
//     (write_queue_limit values) and what it cannot take is dropped and
//     counted, as is every write while Redis is down.
//   * StartLoad / TakeLoad / AbandonLoad: a prompt's blocks past what the
//     node holds; the worker answers with one result per block (a miss or a
//     refused value ends what the chain can use). The caller applies its
//     own deadline (cache.tier_load_timeout_ms) and abandons a late load.
// Faults: a failed connect or command marks Redis down; loads then answer
// at once with misses, writes are dropped, and the worker reconnects at
// most once a second. Each change of state leaves one line in TakeNotice.
//
// Thread-safety: every public method may be called from any thread; the
// worker owns the hiredis context.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache/tier/block_value.h"

struct redisContext;

namespace kvserve {

struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
};
// redis://host[:port][/db]; InvalidArgument naming cache.remote_tier_url.
absl::StatusOr<RedisAddress> ParseRedisUrl(const std::string& url);
// Connects and sends PING (serve --check); the error says what failed.
absl::Status PingRedis(const std::string& url, int timeout_ms);

class RemoteTier {
 public:
  struct BlockRequest {
    BlockHash hash = 0;
    BlockHash parent = 0;
    uint64_t extra_key = 0;
    std::vector<int32_t> tokens;
  };
  struct BlockResult {
    std::shared_ptr<const std::string> value;  // null: a miss or refused
    TierReject reject = TierReject::kNone;
  };
  struct Counters {
    int64_t hit_blocks = 0;
    int64_t miss_blocks = 0;
    int64_t stored_blocks = 0;
    int64_t stored_bytes = 0;
    int64_t write_drops = 0;
    int64_t errors = 0;
    std::array<int64_t, kNumTierRejects> rejects{};
  };

  static absl::StatusOr<std::unique_ptr<RemoteTier>> Create(const std::string& url,
                                                            const TierIdentity& id, int timeout_ms,
                                                            int write_queue_limit = 1024);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  void WriteThrough(BlockHash hash, std::shared_ptr<const std::string> value);
  uint64_t StartLoad(std::vector<BlockRequest> blocks);
  // True once the load is answered (results moved out, ticket forgotten).
  bool TakeLoad(uint64_t ticket, std::vector<BlockResult>* out);
  void AbandonLoad(uint64_t ticket);
  // Waits up to timeout_ms for any load to be answered.
  void WaitForLoads(int timeout_ms);
  bool connected() const;
  Counters counters() const;
  std::string TakeNotice();

 private:
  struct Load {
    uint64_t ticket;
    std::vector<BlockRequest> blocks;
  };
  struct Write {
    BlockHash hash;
    std::shared_ptr<const std::string> value;
  };
  RemoteTier(RedisAddress address, const TierIdentity& id, int timeout_ms, int write_queue_limit);
  void Run();
  bool EnsureConnected();
  void Disconnect(const std::string& why);
  std::vector<BlockResult> DoLoad(const std::vector<BlockRequest>& blocks);
  void DoWrites(std::vector<Write>& writes);
  std::string Key(BlockHash hash) const;

  const RedisAddress address_;
  const TierIdentity id_;
  const int timeout_ms_;
  const size_t write_queue_limit_;
  redisContext* ctx_ = nullptr;  // worker only
  int64_t next_connect_us_ = 0;  // worker only

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  bool up_ = false;
  bool reported_down_ = false;
  std::deque<Load> loads_;
  std::deque<Write> writes_;
  absl::flat_hash_map<uint64_t, std::vector<BlockResult>> answered_;
  absl::flat_hash_map<uint64_t, bool> abandoned_;
  uint64_t next_ticket_ = 1;
  Counters counters_;
  std::string notice_;
  std::thread worker_;
};

}  // namespace kvserve
