#include "cache/tier/remote_tier.h"

#include <hiredis/hiredis.h>

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timeval Timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

constexpr size_t kWriteBatch = 64;  // SETs per pipeline round trip

// A connected context with the database selected, or the reason why not.
absl::StatusOr<redisContext*> Connect(const RedisAddress& a, int timeout_ms) {
  redisContext* c = redisConnectWithTimeout(a.host.c_str(), a.port, Timeval(timeout_ms));
  if (c == nullptr) return absl::UnavailableError("cannot allocate a hiredis context");
  if (c->err != 0) {
    std::string why = c->errstr;
    redisFree(c);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", a.host, ":", a.port, ": ", why));
  }
  redisSetTimeout(c, Timeval(timeout_ms));
  auto* r = static_cast<redisReply*>(redisCommand(c, "SELECT %d", a.db));
  const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
  std::string why = r == nullptr                   ? std::string(c->errstr)
                    : r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                                   : "unexpected reply";
  if (r != nullptr) freeReplyObject(r);
  if (!ok) {
    redisFree(c);
    return absl::UnavailableError(
        absl::StrCat("SELECT ", a.db, " on ", a.host, ":", a.port, ": ", why));
  }
  return c;
}

}  // namespace

absl::StatusOr<RedisAddress> ParseRedisUrl(const std::string& url) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.remote_tier_url must be redis://host:port/db, got \"", url, "\""));
  };
  constexpr std::string_view kScheme = "redis://";
  if (url.rfind(kScheme, 0) != 0) return bad();
  std::string rest = url.substr(kScheme.size());
  RedisAddress a;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    if (!db.empty() && (!absl::SimpleAtoi(db, &a.db) || a.db < 0)) return bad();
    rest.resize(slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    if (!absl::SimpleAtoi(rest.substr(colon + 1), &a.port) || a.port <= 0 || a.port > 65535) {
      return bad();
    }
    rest.resize(colon);
  }
  if (rest.empty()) return bad();
  a.host = rest;
  return a;
}

absl::Status PingRedis(const std::string& url, int timeout_ms) {
  absl::StatusOr<RedisAddress> a = ParseRedisUrl(url);
  if (!a.ok()) return a.status();
  absl::StatusOr<redisContext*> c = Connect(*a, timeout_ms);
  if (!c.ok()) return c.status();
  auto* r = static_cast<redisReply*>(redisCommand(*c, "PING"));
  const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
  if (r != nullptr) freeReplyObject(r);
  redisFree(*c);
  if (!ok) return absl::UnavailableError(absl::StrCat("PING to ", url, " failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(const std::string& url,
                                                               const TierIdentity& id,
                                                               int timeout_ms,
                                                               int write_queue_limit) {
  absl::StatusOr<RedisAddress> a = ParseRedisUrl(url);
  if (!a.ok()) return a.status();
  std::unique_ptr<RemoteTier> t(new RemoteTier(*a, id, timeout_ms, write_queue_limit));
  t->worker_ = std::thread([p = t.get()] { p->Run(); });
  return t;
}

RemoteTier::RemoteTier(RedisAddress address, const TierIdentity& id, int timeout_ms,
                       int write_queue_limit)
    : address_(std::move(address)),
      id_(id),
      timeout_ms_(timeout_ms),
      write_queue_limit_(static_cast<size_t>(write_queue_limit)) {}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (ctx_ != nullptr) redisFree(ctx_);
}

std::string RemoteTier::Key(BlockHash hash) const { return TierStoreKey("kvserve:", id_, hash); }

void RemoteTier::WriteThrough(BlockHash hash, std::shared_ptr<const std::string> value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (writes_.size() >= write_queue_limit_) {
      ++counters_.write_drops;
      return;
    }
    writes_.push_back({hash, std::move(value)});
  }
  work_cv_.notify_one();
}

uint64_t RemoteTier::StartLoad(std::vector<BlockRequest> blocks) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    loads_.push_back({ticket, std::move(blocks)});
  }
  work_cv_.notify_one();
  return ticket;
}

bool RemoteTier::TakeLoad(uint64_t ticket, std::vector<BlockResult>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = answered_.find(ticket);
  if (it == answered_.end()) return false;
  *out = std::move(it->second);
  answered_.erase(it);
  return true;
}

void RemoteTier::AbandonLoad(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (answered_.erase(ticket) > 0) return;
  for (auto it = loads_.begin(); it != loads_.end(); ++it) {
    if (it->ticket == ticket) {
      loads_.erase(it);
      return;
    }
  }
  abandoned_[ticket] = true;  // in flight: its answer is thrown away
}

void RemoteTier::WaitForLoads(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!answered_.empty()) return;
  done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                    [this] { return !answered_.empty() || stop_; });
}

bool RemoteTier::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return up_;
}

RemoteTier::Counters RemoteTier::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::string RemoteTier::TakeNotice() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(notice_, std::string());
}

// ---- Worker ------------------------------------------------------------------

bool RemoteTier::EnsureConnected() {
  if (ctx_ != nullptr) return true;
  const int64_t now = NowMicros();
  if (now < next_connect_us_) return false;
  absl::StatusOr<redisContext*> c = Connect(address_, timeout_ms_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!c.ok()) {
    next_connect_us_ = now + 1000000;
    ++counters_.errors;
    // One line per change of state (and for the first failure).
    if (up_ || !reported_down_) {
      absl::StrAppend(&notice_, notice_.empty() ? "" : "; ",
                      "remote tier down: ", std::string(c.status().message()));
      reported_down_ = true;
    }
    up_ = false;
    return false;
  }
  ctx_ = *c;
  reported_down_ = false;
  if (!up_) {
    absl::StrAppend(&notice_, notice_.empty() ? "" : "; ", "remote tier up: ", address_.host, ":",
                    address_.port, "/", address_.db);
  }
  up_ = true;
  return true;
}

void RemoteTier::Disconnect(const std::string& why) {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
  next_connect_us_ = NowMicros() + 1000000;
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.errors;
  if (up_) absl::StrAppend(&notice_, notice_.empty() ? "" : "; ", "remote tier down: ", why);
  reported_down_ = true;
  up_ = false;
}

std::vector<RemoteTier::BlockResult> RemoteTier::DoLoad(const std::vector<BlockRequest>& blocks) {
  std::vector<BlockResult> out(blocks.size());
  if (!EnsureConnected()) return out;
  for (const BlockRequest& b : blocks) {
    const std::string key = Key(b.hash);
    redisAppendCommand(ctx_, "GET %b", key.data(), key.size());
  }
  std::vector<std::string> refused;
  for (size_t i = 0; i < blocks.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      Disconnect(absl::StrCat("GET: ", ctx_ != nullptr ? ctx_->errstr : "connection lost"));
      for (BlockResult& r : out) r = BlockResult{};
      return out;
    }
    auto* r = static_cast<redisReply*>(raw);
    if (r->type == REDIS_REPLY_STRING) {
      auto value = std::make_shared<std::string>(r->str, r->len);
      const BlockRequest& b = blocks[i];
      const DecodedBlock d =
          DecodeBlockValue(*value, id_, {b.hash, b.parent, b.extra_key, b.tokens});
      if (d.ok()) {
        out[i].value = std::move(value);
      } else {
        out[i].reject = d.reject;
        refused.push_back(Key(b.hash));
      }
    }
    freeReplyObject(r);
  }
  for (const std::string& key : refused) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "DEL %b", key.data(), key.size()));
    if (r == nullptr) {
      Disconnect("DEL: connection lost");
      break;
    }
    freeReplyObject(r);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const BlockResult& r : out) {
    if (r.value != nullptr) {
      ++counters_.hit_blocks;
    } else {
      ++counters_.miss_blocks;
      if (r.reject != TierReject::kNone) ++counters_.rejects[static_cast<int>(r.reject)];
    }
  }
  return out;
}

void RemoteTier::DoWrites(std::vector<Write>& writes) {
  if (!EnsureConnected()) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.write_drops += static_cast<int64_t>(writes.size());
    return;
  }
  for (const Write& w : writes) {
    const std::string key = Key(w.hash);
    redisAppendCommand(ctx_, "SET %b %b", key.data(), key.size(), w.value->data(), w.value->size());
  }
  int64_t stored = 0, bytes = 0;
  for (size_t i = 0; i < writes.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      Disconnect("SET: connection lost");
      std::lock_guard<std::mutex> lock(mu_);
      counters_.write_drops += static_cast<int64_t>(writes.size() - i);
      break;
    }
    auto* r = static_cast<redisReply*>(raw);
    if (r->type == REDIS_REPLY_STATUS) {
      ++stored;
      bytes += static_cast<int64_t>(writes[i].value->size());
    }
    freeReplyObject(r);
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_.stored_blocks += stored;
  counters_.stored_bytes += bytes;
}

void RemoteTier::Run() {
  std::vector<Write> writes;
  for (;;) {
    Load load{0, {}};
    writes.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stop_ || !loads_.empty() || !writes_.empty(); });
      if (stop_) return;
      if (!loads_.empty()) {
        // Loads first: a request waits on them.
        load = std::move(loads_.front());
        loads_.pop_front();
      } else {
        while (!writes_.empty() && writes.size() < kWriteBatch) {
          writes.push_back(std::move(writes_.front()));
          writes_.pop_front();
        }
      }
    }
    if (load.ticket != 0) {
      std::vector<BlockResult> results = DoLoad(load.blocks);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (abandoned_.erase(load.ticket) == 0) answered_[load.ticket] = std::move(results);
      }
      done_cv_.notify_all();
    } else {
      DoWrites(writes);
    }
  }
}

}  // namespace kvserve
