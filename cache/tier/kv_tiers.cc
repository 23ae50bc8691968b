#include "cache/tier/kv_tiers.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TierCounters& At(TierStats& s, TierKind t) { return s[static_cast<int>(t)]; }

}  // namespace

std::string_view TierName(TierKind t) {
  switch (t) {
    case TierKind::kDevice:
      return "device";
    case TierKind::kHost:
      return "host";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRemote:
      return "remote";
  }
  return "unknown";
}

absl::Status KvTierConfig::Validate() const {
  if (host_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.host_tier_bytes must not be negative, got ", host_bytes));
  }
  if (disk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.disk_tier_bytes must not be negative, got ", disk_bytes));
  }
  if (!disk_path.empty() && disk_bytes == 0) {
    return absl::InvalidArgumentError(
        "cache.disk_tier_bytes must be set with cache.disk_tier_path");
  }
  if (disk_path.empty() && disk_bytes > 0) {
    return absl::InvalidArgumentError(
        "cache.disk_tier_path must be set with cache.disk_tier_bytes");
  }
  if (!remote_url.empty() && remote_url.rfind("redis://", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache.remote_tier_url must be redis://host:port/db, got \"", remote_url, "\""));
  }
  if (load_timeout_ms <= 0 || load_timeout_ms > 3'600'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.tier_load_timeout_ms must be in [1, 3600000] (milliseconds), got ",
                     load_timeout_ms));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvTiers>> KvTiers::Create(const KvTierConfig& config,
                                                         const TierIdentity& id,
                                                         std::span<uint8_t> host_arena) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  std::unique_ptr<KvTiers> tiers(new KvTiers(config, id));
  if (config.host_bytes > 0) {
    tiers->host_ = std::make_unique<HostArena>(host_arena, config.host_bytes, TierValueBytes(id));
  }
  if (!config.disk_path.empty()) {
    absl::StatusOr<std::unique_ptr<DiskTier>> disk =
        DiskTier::Open(config.disk_path, config.disk_bytes, id);
    if (!disk.ok()) return disk.status();
    tiers->disk_ = std::move(*disk);
  }
  if (!config.remote_url.empty()) {
    // The worker's socket timeout is longer than the load deadline, so a
    // stalled Redis is abandoned by the deadline (counted as a timeout)
    // before the worker gives up on the connection.
    const int socket_ms = config.load_timeout_ms + std::max(config.load_timeout_ms, 1000);
    absl::StatusOr<std::unique_ptr<RemoteTier>> remote =
        RemoteTier::Create(config.remote_url, id, socket_ms);
    if (!remote.ok()) return remote.status();
    tiers->remote_ = std::move(*remote);
  }
  return tiers;
}

KvTiers::KvTiers(const KvTierConfig& config, const TierIdentity& id)
    : config_(config),
      id_(id),
      staging_(config.staging_bytes),
      staged_disk_(config.staging_bytes) {}

void KvTiers::Store(const TierBlockKey& key, std::span<const uint8_t> payload) {
  if (host_ == nullptr) {
    auto value = std::make_shared<const std::string>(EncodeBlockValue(id_, key, payload));
    StoreValue(key.hash, std::move(value));
    return;
  }
  uint8_t* p = BeginStore(key);
  if (p == nullptr) return;
  std::memcpy(p, payload.data(), payload.size());
  FinishStores();
}

int32_t KvTiers::ReserveHostSlot() {
  evicted_.clear();
  const int32_t slot = host_->Reserve(disk_ != nullptr ? &evicted_ : nullptr);
  ToDisk(evicted_);
  return slot;
}

uint8_t* KvTiers::BeginStore(const TierBlockKey& key) {
  if (host_->Contains(key.hash)) {
    host_->Get(key.hash);  // refreshed: the same bytes
    return nullptr;
  }
  const int32_t slot = ReserveHostSlot();
  if (slot < 0) {
    ++At(stats_, TierKind::kHost).write_drops;
    return nullptr;
  }
  uint8_t* value = host_->slot(slot);
  EncodeBlockHeader(id_, key, value);
  pending_.push_back({slot, key.hash});
  return value + TierHeaderBytes(id_.block_size);
}

void KvTiers::FinishStores() {
  for (const PendingStore& p : pending_) {
    SealBlockValue(host_->slot(p.slot), TierValueBytes(id_));
    host_->Commit(p.slot, p.hash);
    At(stats_, TierKind::kHost).stored_tokens += id_.block_size;
    At(stats_, TierKind::kHost).stored_bytes += TierValueBytes(id_);
  }
  pending_.clear();
}

void KvTiers::StoreValue(BlockHash hash, std::shared_ptr<const std::string> value) {
  // Without a host tier: straight to the disk.
  evicted_.clear();
  evicted_.push_back({hash, std::move(value)});
  ToDisk(evicted_);
}

void KvTiers::ToDisk(const std::vector<HostTier::Entry>& evicted) {
  if (disk_ == nullptr) return;
  for (const HostTier::Entry& e : evicted) {
    if (disk_->Contains(e.hash)) continue;
    if (disk_->Put(e.hash, *e.value)) {
      At(stats_, TierKind::kDisk).stored_tokens += id_.block_size;
      At(stats_, TierKind::kDisk).stored_bytes += static_cast<int64_t>(e.value->size());
    } else {
      ++At(stats_, TierKind::kDisk).write_drops;
    }
  }
  if (!disk_->enabled() && !disk_notice_given_) {
    disk_notice_given_ = true;
    absl::StrAppend(&notice_, notice_.empty() ? "" : "; ",
                    "disk tier off: ", disk_->disabled_reason());
  }
}

void KvTiers::CountLoad(TierKind t, int64_t micros) {
  CountHit(t);
  CountLatency(t, micros);
}

void KvTiers::CountHit(TierKind t) {
  TierCounters& c = At(stats_, t);
  ++c.hit_blocks;
  c.loaded_tokens += id_.block_size;
  c.loaded_bytes += id_.payload_bytes;
}

void KvTiers::CountLatency(TierKind t, int64_t micros) {
  TierCounters& c = At(stats_, t);
  c.load_us_sum += micros;
  ++c.load_count;
  for (size_t i = 0; i < kTierLoadBucketsUs.size(); ++i) {
    if (micros <= kTierLoadBucketsUs[i]) ++c.load_us_le[i];
  }
}

TierHit KvTiers::Find(const TierBlockKey& key) {
  const int64_t start = NowMicros();
  const auto hit = [](std::shared_ptr<const void> owner, std::string_view v, int64_t offset,
                      TierKind t) {
    return TierHit{std::move(owner), reinterpret_cast<const uint8_t*>(v.data()) + offset,
                   static_cast<uint8_t>(t)};
  };
  if (host_ != nullptr) {
    if (HostArena::Pinned p = host_->Get(key.hash); p.pin != nullptr) {
      const DecodedBlock d = DecodeBlockValue(p.value, id_, key);
      if (d.ok()) {
        CountLoad(TierKind::kHost, NowMicros() - start);
        return hit(std::move(p.pin), p.value, d.payload_offset, TierKind::kHost);
      }
      ++At(stats_, TierKind::kHost).rejects[static_cast<int>(d.reject)];
      host_->Erase(key.hash);
    }
    ++At(stats_, TierKind::kHost).miss_blocks;
  }
  // Staged background loads: checked when read, checked again here (the
  // same bytes, against this very key).
  for (auto [stage, t] :
       {std::pair{&staged_disk_, TierKind::kDisk}, std::pair{&staging_, TierKind::kRemote}}) {
    std::shared_ptr<const std::string> v = stage->Get(key.hash);
    if (v == nullptr) continue;
    stage->Erase(key.hash);
    const DecodedBlock d = DecodeBlockValue(*v, id_, key);
    if (d.ok()) {
      CountHit(t);
      const std::string_view bytes = *v;
      return hit(std::move(v), bytes, d.payload_offset, t);
    }
    ++At(stats_, t).rejects[static_cast<int>(d.reject)];
  }
  if (disk_ != nullptr && disk_->enabled() && disk_loader_ != nullptr) {
    // Read in the background only (LocateOnDisk); what was not staged is a miss.
    ++At(stats_, TierKind::kDisk).miss_blocks;
  } else if (disk_ != nullptr && disk_->enabled()) {
    TierReject reject = TierReject::kNone;
    if (std::shared_ptr<const std::string> v = disk_->Get(key, &reject)) {
      CountLoad(TierKind::kDisk, NowMicros() - start);
      const std::string_view bytes = *v;
      return hit(std::move(v), bytes, TierHeaderBytes(id_.block_size), TierKind::kDisk);
    }
    if (reject != TierReject::kNone)
      ++At(stats_, TierKind::kDisk).rejects[static_cast<int>(reject)];
    ++At(stats_, TierKind::kDisk).miss_blocks;
  }
  return {};
}

bool KvTiers::HoldsLocally(BlockHash hash) const {
  return HoldsInMemory(hash) || (disk_ != nullptr && disk_->enabled() && disk_->Contains(hash));
}

bool KvTiers::HoldsInMemory(BlockHash hash) const {
  return (host_ != nullptr && host_->Contains(hash)) || staging_.Contains(hash) ||
         staged_disk_.Contains(hash);
}

void KvTiers::set_background_loads(bool on) {
  if (!on) {
    disk_loader_.reset();
  } else if (disk_ != nullptr && disk_loader_ == nullptr) {
    disk_loader_ = std::make_unique<DiskLoader>(disk_.get());
  }
}

bool KvTiers::LocateOnDisk(BlockHash hash, DiskLoader::Read* read) const {
  if (disk_ == nullptr || !disk_->enabled()) return false;
  return disk_->Locate(hash, &read->slot, &read->generation);
}

void KvTiers::SettleDiskLoad(const std::vector<DiskLoader::Read>& reads,
                             std::vector<DiskLoader::Result>& results, int64_t micros) {
  CountLatency(TierKind::kDisk, micros);
  for (size_t i = 0; i < reads.size() && i < results.size(); ++i) {
    const DiskLoader::Read& r = reads[i];
    DiskLoader::Result& res = results[i];
    const bool same = disk_->Settle(r.hash, r.slot, r.generation, res.reject);
    if (same && res.reject != TierReject::kNone) {
      ++At(stats_, TierKind::kDisk).rejects[static_cast<int>(res.reject)];
    }
    if (!same || res.value == nullptr) break;  // the chain ends here
    staged_disk_.Put(r.hash, std::move(res.value), nullptr);
  }
  if (!disk_->enabled() && !disk_notice_given_) {
    disk_notice_given_ = true;
    absl::StrAppend(&notice_, notice_.empty() ? "" : "; ",
                    "disk tier off: ", disk_->disabled_reason());
  }
}

void KvTiers::CountTimeout(TierKind t) { ++At(stats_, t).load_timeouts; }

void KvTiers::WriteThrough(const TierBlockKey& key, std::span<const uint8_t> payload) {
  if (remote_ == nullptr) return;
  remote_->WriteThrough(key.hash,
                        std::make_shared<const std::string>(EncodeBlockValue(id_, key, payload)));
}

void KvTiers::AddFetched(BlockHash hash, std::shared_ptr<const std::string> value) {
  staging_.Put(hash, std::move(value), nullptr);
}

TierStats KvTiers::Stats() const {
  TierStats s = stats_;
  if (remote_ != nullptr) {
    const RemoteTier::Counters r = remote_->counters();
    TierCounters& c = At(s, TierKind::kRemote);
    c.miss_blocks += r.miss_blocks;
    c.stored_tokens += r.stored_blocks * id_.block_size;
    c.stored_bytes += r.stored_bytes;
    c.write_drops += r.write_drops;
    for (int i = 0; i < kNumTierRejects; ++i) c.rejects[i] += r.rejects[i];
  }
  if (host_ != nullptr) At(s, TierKind::kHost).bytes_used = host_->bytes_used();
  if (disk_ != nullptr) At(s, TierKind::kDisk).bytes_used = disk_->bytes_used();
  return s;
}

std::string KvTiers::TakeNotice() {
  std::string out = std::exchange(notice_, std::string());
  if (remote_ != nullptr) {
    const std::string r = remote_->TakeNotice();
    if (!r.empty()) absl::StrAppend(&out, out.empty() ? "" : "; ", r);
  }
  return out;
}

}  // namespace kvserve
