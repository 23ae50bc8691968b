#include "cache/tier/kv_tiers.h"

#include <chrono>
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
  if (load_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.tier_load_timeout_ms must be positive, got ", load_timeout_ms));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvTiers>> KvTiers::Create(const KvTierConfig& config,
                                                         const TierIdentity& id) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  std::unique_ptr<KvTiers> tiers(new KvTiers(config, id));
  if (config.host_bytes > 0) tiers->host_ = std::make_unique<HostTier>(config.host_bytes);
  if (!config.disk_path.empty()) {
    absl::StatusOr<std::unique_ptr<DiskTier>> disk =
        DiskTier::Open(config.disk_path, config.disk_bytes, id);
    if (!disk.ok()) return disk.status();
    tiers->disk_ = std::move(*disk);
  }
  if (!config.remote_url.empty()) {
    absl::StatusOr<std::unique_ptr<RemoteTier>> remote =
        RemoteTier::Create(config.remote_url, id, config.load_timeout_ms);
    if (!remote.ok()) return remote.status();
    tiers->remote_ = std::move(*remote);
  }
  return tiers;
}

KvTiers::KvTiers(const KvTierConfig& config, const TierIdentity& id) : config_(config), id_(id) {}

void KvTiers::Store(const TierBlockKey& key, std::span<const uint8_t> payload) {
  if (host_ != nullptr && host_->Contains(key.hash)) {
    host_->Get(key.hash);  // refreshed: the same bytes
    return;
  }
  auto value = std::make_shared<const std::string>(EncodeBlockValue(id_, key, payload));
  StoreValue(key.hash, std::move(value), static_cast<int32_t>(key.tokens.size()));
}

void KvTiers::StoreValue(BlockHash hash, std::shared_ptr<const std::string> value, int32_t tokens) {
  const int64_t bytes = static_cast<int64_t>(value->size());
  evicted_.clear();
  if (host_ != nullptr) {
    if (host_->Put(hash, value, &evicted_)) {
      At(stats_, TierKind::kHost).stored_tokens += tokens;
      At(stats_, TierKind::kHost).stored_bytes += bytes;
    } else {
      ++At(stats_, TierKind::kHost).write_drops;
    }
  } else {
    evicted_.push_back({hash, std::move(value)});
  }
  if (disk_ == nullptr) return;
  for (const HostTier::Entry& e : evicted_) {
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
    absl::StrAppend(&notice_, "disk tier off: ", disk_->disabled_reason());
  }
}

void KvTiers::CountLoad(TierKind t, int64_t micros) {
  TierCounters& c = At(stats_, t);
  ++c.hit_blocks;
  c.loaded_tokens += id_.block_size;
  c.loaded_bytes += id_.payload_bytes;
  c.load_us_sum += micros;
  ++c.load_count;
  for (size_t i = 0; i < kTierLoadBucketsUs.size(); ++i) {
    if (micros <= kTierLoadBucketsUs[i]) ++c.load_us_le[i];
  }
}

TierHit KvTiers::Find(const TierBlockKey& key) {
  const int64_t start = NowMicros();
  if (host_ != nullptr) {
    if (std::shared_ptr<const std::string> v = host_->Get(key.hash)) {
      const DecodedBlock d = DecodeBlockValue(*v, id_, key);
      if (d.ok()) {
        CountLoad(TierKind::kHost, NowMicros() - start);
        return TierHit{std::move(v), d.payload_offset, static_cast<uint8_t>(TierKind::kHost)};
      }
      ++At(stats_, TierKind::kHost).rejects[static_cast<int>(d.reject)];
      host_->Erase(key.hash);
    }
    ++At(stats_, TierKind::kHost).miss_blocks;
  }
  if (remote_ != nullptr) {
    if (std::shared_ptr<const std::string> v = staging_.Get(key.hash)) {
      staging_.Erase(key.hash);
      const DecodedBlock d = DecodeBlockValue(*v, id_, key);
      if (d.ok()) {
        TierCounters& c = At(stats_, TierKind::kRemote);
        ++c.hit_blocks;
        c.loaded_tokens += id_.block_size;
        c.loaded_bytes += id_.payload_bytes;
        return TierHit{std::move(v), d.payload_offset, static_cast<uint8_t>(TierKind::kRemote)};
      }
      ++At(stats_, TierKind::kRemote).rejects[static_cast<int>(d.reject)];
    }
  }
  if (disk_ != nullptr && disk_->enabled()) {
    TierReject reject = TierReject::kNone;
    if (std::shared_ptr<const std::string> v = disk_->Get(key, &reject)) {
      CountLoad(TierKind::kDisk, NowMicros() - start);
      return TierHit{std::move(v), TierHeaderBytes(id_.block_size),
                     static_cast<uint8_t>(TierKind::kDisk)};
    }
    if (reject != TierReject::kNone)
      ++At(stats_, TierKind::kDisk).rejects[static_cast<int>(reject)];
    ++At(stats_, TierKind::kDisk).miss_blocks;
  }
  return {};
}

bool KvTiers::HoldsLocally(BlockHash hash) const {
  return (host_ != nullptr && host_->Contains(hash)) || staging_.Contains(hash) ||
         (disk_ != nullptr && disk_->enabled() && disk_->Contains(hash));
}

void KvTiers::WriteThrough(const TierBlockKey& key, std::span<const uint8_t> payload) {
  if (remote_ == nullptr) return;
  remote_->WriteThrough(key.hash,
                        std::make_shared<const std::string>(EncodeBlockValue(id_, key, payload)));
}

void KvTiers::AddFetched(BlockHash hash, std::shared_ptr<const std::string> value) {
  staging_.Put(hash, std::move(value), nullptr);
}

void KvTiers::CountRemoteLoad(int64_t micros) {
  TierCounters& c = At(stats_, TierKind::kRemote);
  c.load_us_sum += micros;
  ++c.load_count;
  for (size_t i = 0; i < kTierLoadBucketsUs.size(); ++i) {
    if (micros <= kTierLoadBucketsUs[i]) ++c.load_us_le[i];
  }
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
