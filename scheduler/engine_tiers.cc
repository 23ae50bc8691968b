#include "scheduler/engine_tiers.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

// Hashes fields one after another (their bytes, no padding).
class FieldHash {
 public:
  template <typename T>
  FieldHash& Add(const T& v) {
    return AddBytes(&v, sizeof(T));
  }
  FieldHash& Add(const std::string& s) {
    Add(s.size());
    return AddBytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  FieldHash& AddBytes(const void* p, size_t n) {
    h_ = TierChecksum(static_cast<const uint8_t*>(p), n, h_);
    return *this;
  }
  uint64_t h_ = 0x6b7673657276ull;  // "kvserv"
};

void AddPart(FieldHash& h, const KvPartLayout& p) {
  h.Add(static_cast<int>(p.elem)).Add(p.row_bytes).Add(p.meta_bytes).Add(p.group_size);
  h.Add(p.data_offset).Add(p.meta_offset);
}

}  // namespace

TierIdentity TierIdentityOf(const ModelRunner& runner, const std::string& weights_fingerprint) {
  const ModelConfig& c = runner.config();
  FieldHash model;
  model.Add(weights_fingerprint).Add(runner.memory_info().weight_dtype);
  model.Add(c.dim).Add(c.hidden_dim).Add(c.num_layers).Add(c.num_heads).Add(c.num_kv_heads);
  model.Add(c.head_dim).Add(c.vocab_size).Add(c.rope_theta).Add(static_cast<int>(c.rope_style));
  model.Add(static_cast<int>(c.rope_scaling.type)).Add(c.rope_scaling.factor);
  model.Add(c.rope_scaling.low_freq_factor).Add(c.rope_scaling.high_freq_factor);
  model.Add(c.rope_scaling.original_max_position_embeddings).Add(c.rms_norm_eps);
  model.Add(c.qkv_bias).Add(c.o_bias).Add(c.qk_norm).Add(c.sliding_window);
  const KvFormat& f = runner.kv_format();
  const KvPageLayout& lay = f.layout();
  FieldHash format;
  format.Add(static_cast<int>(f.dtype())).Add(lay.num_kv_heads).Add(lay.head_dim);
  format.Add(lay.block_size).Add(lay.block_bytes).Add(runner.tier_block_bytes());
  AddPart(format, lay.k);
  AddPart(format, lay.v);
  return TierIdentity{.model_fingerprint = model.value(),
                      .kv_format = format.value(),
                      .block_size = f.block_size(),
                      .payload_bytes = runner.tier_block_bytes()};
}

absl::StatusOr<std::unique_ptr<EngineTiers>> EngineTiers::Create(
    const KvTierConfig& config, const ModelRunner& runner, const std::string& weights_fingerprint) {
  KV_RETURN_IF_ERROR(config.Validate());
  if (!runner.supports_kv_tiers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache.host_tier_bytes, cache.disk_tier_path and cache.remote_tier_url need a model "
        "runner with KV tiers (the CPU runner; ",
        runner.memory_info().device, " has none)"));
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<KvTiers> tiers,
                      KvTiers::Create(config, TierIdentityOf(runner, weights_fingerprint)));
  return std::unique_ptr<EngineTiers>(new EngineTiers(std::move(tiers)));
}

uint64_t EngineTiers::hash_seed() const {
  const TierIdentity& id = tiers_->identity();
  const uint64_t words[2] = {id.model_fingerprint, id.kv_format};
  return TierChecksum(reinterpret_cast<const uint8_t*>(words), sizeof(words), 0x7365656400ull);
}

absl::Status EngineTiers::RunSpills(const TierTransfers& t, ModelRunner& runner,
                                    int32_t block_size) {
  if (t.spills.empty() && t.writes.empty()) return absl::OkStatus();
  const int64_t per_block = runner.tier_block_bytes();
  ids_.clear();
  for (const TierSpill& s : t.spills) ids_.push_back(s.block);
  for (const TierSpill& s : t.writes) ids_.push_back(s.block);
  bytes_.resize(ids_.size() * static_cast<size_t>(per_block));
  KV_RETURN_IF_ERROR(runner.ExportBlocks(ids_, bytes_));
  auto key_of = [&](const TierSpill& s, const std::vector<int32_t>& tokens, size_t i) {
    return TierBlockKey{
        s.hash, s.parent, s.extra_key,
        std::span<const int32_t>(tokens).subspan(i * static_cast<size_t>(block_size), block_size)};
  };
  auto payload = [&](size_t i) {
    return std::span<const uint8_t>(bytes_).subspan(i * per_block, per_block);
  };
  for (size_t i = 0; i < t.spills.size(); ++i) {
    tiers_->Store(key_of(t.spills[i], t.spill_tokens, i), payload(i));
  }
  for (size_t i = 0; i < t.writes.size(); ++i) {
    tiers_->WriteThrough(key_of(t.writes[i], t.write_tokens, i), payload(t.spills.size() + i));
  }
  return absl::OkStatus();
}

absl::Status EngineTiers::RunLoads(const TierTransfers& t, ModelRunner& runner) {
  if (t.loads.empty()) return absl::OkStatus();
  ids_.clear();
  inputs_.clear();
  for (const TierLoad& l : t.loads) {
    ids_.push_back(l.block);
    inputs_.push_back(reinterpret_cast<const uint8_t*>(l.hit.value->data()) + l.hit.payload_offset);
  }
  return runner.ImportBlocks(ids_, inputs_);
}

TierStats EngineTiers::Stats(const KvCacheStats& kv, int32_t block_size) const {
  TierStats s = tiers_->Stats();
  TierCounters& d = s[static_cast<int>(TierKind::kDevice)];
  d.hit_blocks = kv.prefix_hit_tokens / block_size;
  d.miss_blocks = (kv.prefix_query_tokens - kv.prefix_hit_tokens) / block_size;
  d.stored_tokens = 0;
  d.bytes_used = 0;
  return s;
}

}  // namespace kvserve
