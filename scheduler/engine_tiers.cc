#include "scheduler/engine_tiers.h"

#include <algorithm>
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
  // Every layer's format: per-layer lists of the same total bytes (int8,
  // int4 against int4, int8) give a block's bytes other meanings.
  FieldHash format;
  format.Add(runner.tier_block_bytes());
  for (int l = 0; l < c.num_layers; ++l) {
    const KvFormat& f = runner.layer_kv_format(l);
    const KvPageLayout& lay = f.layout();
    format.Add(static_cast<int>(f.dtype())).Add(lay.num_kv_heads).Add(lay.head_dim);
    format.Add(lay.block_size).Add(lay.block_bytes);
    AddPart(format, lay.k);
    AddPart(format, lay.v);
  }
  return TierIdentity{.model_fingerprint = model.value(),
                      .kv_format = format.value(),
                      .block_size = runner.kv_format().block_size(),
                      .payload_bytes = runner.tier_block_bytes()};
}

absl::StatusOr<std::unique_ptr<EngineTiers>> EngineTiers::Create(
    const KvTierConfig& config, ModelRunner& runner, const std::string& weights_fingerprint) {
  KV_RETURN_IF_ERROR(config.Validate());
  if (!runner.supports_kv_tiers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache.host_tier_bytes, cache.disk_tier_path and cache.remote_tier_url need a model "
        "runner with KV tiers (the CPU runner; ",
        runner.memory_info().device, " has none)"));
  }
  std::span<uint8_t> arena;
  if (config.host_bytes > 0) {
    KV_ASSIGN_OR_RETURN(arena, runner.AllocateTierArena(config.host_bytes));
  }
  const TierIdentity id = TierIdentityOf(runner, weights_fingerprint);
  // A prompt's loads wait staged until it takes them all: room for a whole
  // device pool's worth, so the end of a long prompt never pushes out its start.
  KvTierConfig with_staging = config;
  with_staging.staging_bytes =
      std::max(KvTierConfig::kMinStagingBytes, int64_t{runner.num_blocks()} * TierValueBytes(id));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<KvTiers> tiers, KvTiers::Create(with_staging, id, arena));
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
  const int64_t per = runner.tier_block_bytes();
  auto key_of = [&](const TierSpill& s, const std::vector<int32_t>& tokens, size_t i) {
    return TierBlockKey{
        s.hash, s.parent, s.extra_key,
        std::span<const int32_t>(tokens).subspan(i * static_cast<size_t>(block_size), block_size)};
  };
  // Spills with a host tier: straight into its slots (asynchronously where
  // the slots are the runner's pinned arena). The rest (no host tier, and
  // write-throughs) through bytes_, done at return.
  ids_.clear();
  outputs_.clear();
  copied_.clear();
  const bool host = tiers_->host() != nullptr;
  for (size_t i = 0; i < t.spills.size(); ++i) {
    if (!host) {
      copied_.push_back(i);
      continue;
    }
    if (uint8_t* p = tiers_->BeginStore(key_of(t.spills[i], t.spill_tokens, i))) {
      ids_.push_back(t.spills[i].block);
      outputs_.push_back(p);
    }
  }
  for (size_t i = 0; i < t.writes.size(); ++i) copied_.push_back(t.spills.size() + i);
  if (!ids_.empty()) KV_RETURN_IF_ERROR(runner.ExportBlocksTo(ids_, outputs_));
  if (copied_.empty()) return absl::OkStatus();
  ids_.clear();
  outputs_.clear();
  bytes_.resize(copied_.size() * static_cast<size_t>(per));
  for (size_t k = 0; k < copied_.size(); ++k) {
    const size_t i = copied_[k];
    ids_.push_back(i < t.spills.size() ? t.spills[i].block : t.writes[i - t.spills.size()].block);
    outputs_.push_back(bytes_.data() + k * per);
  }
  KV_RETURN_IF_ERROR(runner.ExportBlocksTo(ids_, outputs_));
  for (size_t k = 0; k < copied_.size(); ++k) {
    const size_t i = copied_[k];
    const std::span<const uint8_t> payload(outputs_[k], static_cast<size_t>(per));
    if (i < t.spills.size()) {
      tiers_->Store(key_of(t.spills[i], t.spill_tokens, i), payload);
    } else {
      const size_t w = i - t.spills.size();
      tiers_->WriteThrough(key_of(t.writes[w], t.write_tokens, w), payload);
    }
  }
  return absl::OkStatus();
}

absl::Status EngineTiers::FinishSpills(ModelRunner& runner) {
  if (!tiers_->stores_pending()) return absl::OkStatus();
  KV_RETURN_IF_ERROR(runner.FinishExports());
  tiers_->FinishStores();
  return absl::OkStatus();
}

absl::Status EngineTiers::RunLoads(const TierTransfers& t, ModelRunner& runner) {
  if (t.loads.empty()) return absl::OkStatus();
  ids_.clear();
  inputs_.clear();
  for (const TierLoad& l : t.loads) {
    ids_.push_back(l.block);
    inputs_.push_back(l.hit.payload);
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
