#include "model/cpu/cpu_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention/cross_layer_attention.h"
#include "kernels/cpu/attention/low_rank_attention.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/layers/gemm.h"
#include "kernels/plan/attention_plan.h"
#include "model/batch_check.h"
#include "model/cpu/cpu_threads.h"
#include "model/loader/quantize_weights.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status CheckTensor(const Tensor& t, int64_t numel, const std::string& name) {
  if (t.data == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("weights: ", name, " is missing"));
  if (t.numel() != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", name, " has ", t.numel(), " elements, the config needs ", numel));
  }
  return absl::OkStatus();
}

absl::Status CheckWeights(const LlamaWeights& w) {
  const ModelConfig& c = w.config;
  KV_RETURN_IF_ERROR(c.Validate());
  if (static_cast<int>(w.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", w.layers.size(), " layers, the config says ", c.num_layers));
  }
  const int64_t dim = c.dim, hid = c.hidden_dim;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  KV_RETURN_IF_ERROR(CheckTensor(w.tok_embeddings, c.vocab_size * dim, "tok_embeddings"));
  KV_RETURN_IF_ERROR(CheckTensor(w.final_norm, dim, "final_norm"));
  KV_RETURN_IF_ERROR(CheckTensor(w.output, c.vocab_size * dim, "output"));
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    KV_RETURN_IF_ERROR(CheckTensor(lw.attn_norm, dim, p + "attn_norm"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.wq, qd * dim, p + "wq"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.wk, kvd * dim, p + "wk"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.wv, kvd * dim, p + "wv"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.wo, dim * qd, p + "wo"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.ffn_norm, dim, p + "ffn_norm"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.w_gate, hid * dim, p + "w_gate"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.w_down, dim * hid, p + "w_down"));
    KV_RETURN_IF_ERROR(CheckTensor(lw.w_up, hid * dim, p + "w_up"));
    if (c.qkv_bias) {
      KV_RETURN_IF_ERROR(CheckTensor(lw.bq, qd, p + "bq"));
      KV_RETURN_IF_ERROR(CheckTensor(lw.bk, kvd, p + "bk"));
      KV_RETURN_IF_ERROR(CheckTensor(lw.bv, kvd, p + "bv"));
    }
    if (c.o_bias) KV_RETURN_IF_ERROR(CheckTensor(lw.bo, dim, p + "bo"));
    if (c.qk_norm) {
      KV_RETURN_IF_ERROR(CheckTensor(lw.q_norm, c.head_dim, p + "q_norm"));
      KV_RETURN_IF_ERROR(CheckTensor(lw.k_norm, c.head_dim, p + "k_norm"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuForward>> CpuForward::Create(
    LlamaWeights weights, int num_threads, std::shared_ptr<const LowRankKv> low_rank,
    const KvCrossLayerSpec& cross_layer) {
  KV_RETURN_IF_ERROR(CheckWeights(weights));
  if (cross_layer.enabled()) {
    KV_RETURN_IF_ERROR(cross_layer.Validate(weights.config.num_layers));
    if (low_rank != nullptr) {
      return absl::InvalidArgumentError(
          "cache.cross_layer: not with cache.low_rank (its latents are not a layer's K/V)");
    }
  }
  if (low_rank != nullptr) {
    KV_RETURN_IF_ERROR(ValidateLowRankKv(*low_rank, "cache.low_rank"));
    const ModelConfig& c = weights.config;
    if (low_rank->num_layers != c.num_layers || low_rank->dim != c.dim ||
        low_rank->num_heads != c.num_heads || low_rank->num_kv_heads != c.num_kv_heads ||
        low_rank->head_dim != c.head_dim) {
      return absl::InvalidArgumentError("cache.low_rank: the bases are of another model's shape");
    }
    for (const LayerWeights& l : weights.layers) {
      if (l.wo.data == nullptr) {
        return absl::InvalidArgumentError(
            "cache.low_rank: folding V's basis into the output projection needs its fp32 weights");
      }
    }
  }
  if (num_threads <= 0) num_threads = DefaultCpuThreads();
  return std::unique_ptr<CpuForward>(
      new CpuForward(std::move(weights), num_threads, std::move(low_rank), cross_layer));
}

CpuForward::CpuForward(LlamaWeights weights, int num_threads,
                       std::shared_ptr<const LowRankKv> low_rank,
                       const KvCrossLayerSpec& cross_layer)
    : weights_(std::move(weights)),
      rope_(weights_.config.max_position_embeddings, weights_.config.RopeInvFreq()),
      inv_freq_(weights_.config.RopeInvFreq()),
      pool_(num_threads),
      low_rank_(std::move(low_rank)),
      cross_(cross_layer) {
  const ModelConfig& c = weights_.config;
  q_dim_ = c.num_heads * c.head_dim;
  kv_dim_ = c.num_kv_heads * c.head_dim;
  attn_scale_ = 1.0f / sqrtf(static_cast<float>(c.head_dim));
  macs_per_token_ = int64_t{c.num_layers} * (int64_t{c.dim} * (2 * q_dim_ + 2 * kv_dim_) +
                                             3 * int64_t{c.dim} * c.hidden_dim) +
                    int64_t{c.vocab_size} * c.dim;
  for (const LayerWeights& w : weights_.layers) {
    LayerMatrices m;
    m.wq.f = w.wq.data;
    m.wk.f = w.wk.data;
    m.wv.f = w.wv.data;
    m.wo.f = w.wo.data;
    m.w_gate.f = w.w_gate.data;
    m.w_up.f = w.w_up.data;
    m.w_down.f = w.w_down.data;
    mats_.push_back(m);
  }
  output_.f = weights_.output.data;
  if (const QuantizedLinears* q = weights_.quantized.get(); q != nullptr) {
    for (size_t l = 0; l < q->layers.size() && l < mats_.size(); ++l) {
      const QuantizedLinears::Layer& ql = q->layers[l];
      LayerMatrices& m = mats_[l];
      m.wq.q = &ql.wq;
      m.wk.q = &ql.wk;
      m.wv.q = &ql.wv;
      m.wo.q = &ql.wo;
      m.w_gate.q = &ql.w_gate;
      m.w_up.q = &ql.w_up;
      m.w_down.q = &ql.w_down;
    }
    if (!q->output.empty()) output_.q = &q->output;
    granule_ = cpu::kQuantBlock;
  }
  RepackIfMisaligned();
  att_width_ = q_dim_;
  if (low_rank_) FoldLowRank();
}

void CpuForward::MatMul(const float* x, int64_t rows, int64_t in, const Matrix& m, int64_t c0,
                        int64_t c1, float* y, int64_t ldy, bool accumulate) {
  if (m.q != nullptr) {
    cpu::QuantLinear(x, rows, *m.q, c0, c1, y, ldy, accumulate);
  } else {
    cpu::Linear(x, rows, in, m.f + c0 * in, c1 - c0, y, ldy, accumulate);
  }
}

void CpuForward::FreeDeleter::operator()(float* p) const { std::free(p); }

void CpuForward::RepackIfMisaligned() {
  constexpr int64_t kAlignFloats = 16;  // 64 bytes
  auto misaligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 64 != 0; };
  auto padded = [](int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; };
  std::vector<std::pair<const float**, int64_t>> todo;  // matrix pointer, floats
  auto add = [&](Matrix& m, const Tensor& t) {
    if (m.q == nullptr) todo.push_back({&m.f, t.numel()});  // quantized: f is not read
  };
  for (size_t l = 0; l < mats_.size(); ++l) {
    const LayerWeights& w = weights_.layers[l];
    LayerMatrices& m = mats_[l];
    add(m.wq, w.wq);
    add(m.wk, w.wk);
    add(m.wv, w.wv);
    add(m.wo, w.wo);
    add(m.w_gate, w.w_gate);
    add(m.w_up, w.w_up);
    add(m.w_down, w.w_down);
  }
  add(output_, weights_.output);
  if (todo.empty()) return;
  int64_t total = 0;
  bool any_misaligned = false;
  for (const auto& [ptr, n] : todo) {
    total += padded(n);
    any_misaligned |= misaligned(*ptr);
  }
  if (!any_misaligned || total * int64_t{sizeof(float)} > kMaxRepackBytes) return;
  float* arena = static_cast<float*>(std::aligned_alloc(64, total * sizeof(float)));
  if (arena == nullptr) return;  // keep reading the weights in place
  arena_.reset(arena);
  int64_t off = 0;
  for (const auto& [ptr, n] : todo) {
    std::copy(*ptr, *ptr + n, arena + off);
    *ptr = arena + off;
    off += padded(n);
  }
}

absl::Status CpuForward::Validate(const BatchInput& batch, const HostKvPages& kv,
                                  std::span<float> logits) const {
  const ModelConfig& c = weights_.config;
  const KvFormat& f = kv.format();
  if (!low_rank_ && (kv.num_layers() != c.num_layers || f.num_kv_heads() != c.num_kv_heads ||
                     f.head_dim() != c.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pages (", kv.num_layers(), " layers, ", f.num_kv_heads(),
                     " kv heads, head_dim ", f.head_dim(), ") do not match the model (",
                     c.num_layers, ", ", c.num_kv_heads, ", ", c.head_dim, ")"));
  }
  BatchLimits limits;
  limits.vocab_size = c.vocab_size;
  limits.max_positions = std::numeric_limits<int32_t>::max();  // RopeAt runs past the table
  limits.num_blocks = kv.num_blocks();
  limits.block_size = f.block_size();
  limits.sliding_window = c.sliding_window;
  limits.num_tails = kv.has_tails() ? kv.num_tails() : 0;
  KV_RETURN_IF_ERROR(ValidateBatch(batch, limits));
  if (low_rank_) KV_RETURN_IF_ERROR(ValidateLowRank(batch, kv));
  KV_RETURN_IF_ERROR(ValidateCrossLayer(batch, kv));
  const size_t want = batch.logits_rows.size() * static_cast<size_t>(c.vocab_size);
  if (logits.size() < want) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits buffer has ", logits.size(), " floats, the batch needs ", want));
  }
  return absl::OkStatus();
}

void CpuForward::EnsureCapacity(int64_t rows, int64_t logit_rows) {
  const ModelConfig& c = weights_.config;
  if (rows > capacity_) {
    capacity_ = std::max(rows, capacity_ * 2);
    x_.resize(capacity_ * c.dim);
    xb_.resize(capacity_ * c.dim);
    q_.resize(capacity_ * q_dim_);
    k_.resize(capacity_ * kv_dim_);
    v_.resize(capacity_ * kv_dim_);
    if (cross_.enabled()) {
      base_k_.resize(capacity_ * kv_dim_);
      base_v_.resize(capacity_ * kv_dim_);
    }
    att_.resize(capacity_ * att_width_);
    k_lat_.resize(capacity_ * latent_width_);
    v_lat_.resize(capacity_ * latent_width_);
    gate_.resize(capacity_ * c.hidden_dim);
    up_.resize(capacity_ * c.hidden_dim);
  }
  if (logit_rows > logit_capacity_) {
    logit_capacity_ = std::max(logit_rows, logit_capacity_ * 2);
    final_.resize(logit_capacity_ * c.dim);
  }
}

void CpuForward::PlanStep(const BatchInput& batch) {
  const ModelConfig& c = weights_.config;
  const int32_t T = batch.num_tokens();
  const BatchView view = ViewOf(batch);
  // Q.K and P.V for every head and layer.
  const int64_t attn_macs = CountAttentionKeys(view, c.sliding_window) * 2 * q_dim_ * c.num_layers;
  const int64_t macs = int64_t{T} * macs_per_token_ + attn_macs;
  const int threads = pool_.num_threads();
  if (threads == 1 || macs < kParallelMinMacs) {
    split_rows_ = true;
    row_chunks_ = 1;
    col_chunks_ = 1;
    attn_split_.assign({0, T});
    return;
  }
  // A split over output features takes four phases per layer; each must
  // carry enough work to pay for its hand-off.
  const int64_t column_phase_macs = int64_t{T} * macs_per_token_ / (4 * int64_t{c.num_layers});
  split_rows_ = T >= int64_t{kMinRowsPerThread} * threads ||
                (T >= 2 && column_phase_macs < kMinColumnPhaseMacs);
  if (!split_rows_ && column_phase_macs < kMinColumnPhaseMacs) {  // one small row
    row_chunks_ = 1;
    col_chunks_ = 1;
    attn_split_.assign({0, T});
    return;
  }
  row_chunks_ = split_rows_ ? static_cast<int>(std::min<int64_t>(threads, T)) : 1;
  col_chunks_ = split_rows_ ? threads : kColumnChunksPerThread * threads;
  if (T < 2) {
    attn_split_.assign({0, T});
    return;
  }
  // A row costs the keys it reads plus a fixed overhead.
  constexpr int64_t kRowOverhead = 8;
  attn_split_ = SplitRowsByAttentionCost(view, c.sliding_window,
                                         kAttentionChunksPerThread * threads, kRowOverhead);
}

template <typename Fn>
void CpuForward::RunColumns(int64_t cols, Fn&& fn) {
  const int64_t granules = (cols + granule_ - 1) / granule_;
  const int chunks = static_cast<int>(std::min<int64_t>(col_chunks_, granules));
  pool_.Run(chunks, [&](int ch) {
    int64_t g0, g1;
    cpu::SplitRange(granules, chunks, ch, &g0, &g1);
    fn(g0 * granule_, std::min(cols, g1 * granule_));
  });
}

void CpuForward::PlanEviction(const BatchInput& batch) {
  const int32_t T = batch.num_tokens(), B = batch.num_seqs();
  const BatchView view = ViewOf(batch);
  sink_pos_.clear();
  for (int32_t b = 0; b < static_cast<int32_t>(batch.num_sinks.size()); ++b) {
    if (batch.num_sinks[b] <= 0) continue;
    if (sink_pos_.empty()) sink_pos_.assign(T, -1);
    for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
      sink_pos_[r] = view.CacheIndex(b, r);
    }
  }
  if (!sink_pos_.empty()) sink_q_.resize(static_cast<size_t>(T) * q_dim_);
  mass_offset_.clear();
  stats_offset_.clear();
  attn_stats_.clear();
  int64_t keys = 0, stats = 0;
  const int32_t window = weights_.config.sliding_window;
  for (int32_t b = 0; b < static_cast<int32_t>(batch.attention_stats.size()); ++b) {
    if (batch.attention_stats[b] == 0) continue;
    if (mass_offset_.empty()) {
      mass_offset_.assign(T, -1);
      stats_offset_.assign(B, -1);
    }
    for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
      mass_offset_[r] = keys;
      keys += NumKeys(view.CacheIndex(b, r), window);
    }
    stats_offset_[b] = stats;
    stats += int64_t{weights_.config.num_layers} * batch.context_len[b];
  }
  row_mass_.resize(keys);
  attn_stats_.assign(stats, 0.0f);
}

void CpuForward::RopeAt(int32_t pos, float* scratch, const float** cos, const float** sin) const {
  if (pos < rope_.max_positions()) {
    *cos = rope_.cos(pos);
    *sin = rope_.sin(pos);
    return;
  }
  // As the table (cpu::RopeTable): the angle in float, then cosf / sinf.
  const int half = rope_.half_dim();
  for (int j = 0; j < half; ++j) {
    const float val = static_cast<float>(pos) * inv_freq_[j];
    scratch[j] = cosf(val);
    scratch[half + j] = sinf(val);
  }
  *cos = scratch;
  *sin = scratch + half;
}

void CpuForward::GatherAttentionStats(const BatchInput& batch, int layer) {
  const BatchView view = ViewOf(batch);
  const int32_t window = weights_.config.sliding_window;
  for (int32_t b = 0; b < static_cast<int32_t>(stats_offset_.size()); ++b) {
    if (stats_offset_[b] < 0) continue;
    const int32_t ctx = batch.context_len[b];
    float* out = attn_stats_.data() + stats_offset_[b] + static_cast<int64_t>(layer) * ctx;
    for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
      const int32_t idx = view.CacheIndex(b, r);
      const int32_t lo = KeyBegin(idx, window);
      const float* m = row_mass_.data() + mass_offset_[r];
      for (int32_t j = lo; j <= idx; ++j) out[j] += m[j - lo];
    }
  }
}

void CpuForward::NormAttention(int layer, int64_t r0, int64_t r1) {
  const ModelConfig& c = weights_.config;
  cpu::RmsNorm(x_.data() + r0 * c.dim, weights_.layers[layer].attn_norm.data,
               xb_.data() + r0 * c.dim, r1 - r0, c.dim, c.rms_norm_eps);
}

void CpuForward::Qkv(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t dim = weights_.config.dim;
  const LayerMatrices& m = mats_[layer];
  struct Part {
    const Matrix& w;
    float* y;
    int64_t width;
  };
  const Part parts[3] = {
      {m.wq, q_.data(), q_dim_}, {m.wk, k_.data(), kv_dim_}, {m.wv, v_.data(), kv_dim_}};
  int64_t base = 0;  // where the part starts in q|k|v
  for (const Part& p : parts) {
    const int64_t lo = std::max(c0, base) - base, hi = std::min(c1, base + p.width) - base;
    if (lo < hi) {
      MatMul(xb_.data() + r0 * dim, r1 - r0, dim, p.w, lo, hi, p.y + r0 * p.width + lo, p.width,
             false);
    }
    base += p.width;
  }
}

void CpuForward::FinishQkv(int layer, const BatchInput& batch, HostKvPages& kv, int64_t r0,
                           int64_t r1) {
  const int64_t n = r1 - r0;
  if (n <= 0) return;
  const ModelConfig& c = weights_.config;
  const LayerWeights& w = weights_.layers[layer];
  float* q = q_.data() + r0 * q_dim_;
  float* k = k_.data() + r0 * kv_dim_;
  float* v = v_.data() + r0 * kv_dim_;
  if (c.qkv_bias) {
    cpu::AddBias(q, w.bq.data, n, q_dim_);
    cpu::AddBias(k, w.bk.data, n, kv_dim_);
    cpu::AddBias(v, w.bv.data, n, kv_dim_);
  }
  if (c.qk_norm) {  // every head of every row is one RMSNorm row
    cpu::RmsNorm(q, w.q_norm.data, q, n * c.num_heads, c.head_dim, c.rms_norm_eps);
    cpu::RmsNorm(k, w.k_norm.data, k, n * c.num_kv_heads, c.head_dim, c.rms_norm_eps);
  }
  if (kv_observer_) kv_observer_(layer, r0, n, q, k, v);
  if (low_rank_) ProjectLatents(layer, r0, r1);
  const bool interleaved = c.rope_style == RopeStyle::kInterleaved;
  thread_local std::vector<float> rope_scratch;
  rope_scratch.resize(c.head_dim);
  const float* cs;
  const float* sn;
  for (int64_t i = 0; i < n; ++i) {
    if (!sink_pos_.empty() && sink_pos_[r0 + i] >= 0) {
      // The sink query: the same q rotated at the row's in-cache position.
      float* sq = sink_q_.data() + (r0 + i) * q_dim_;
      std::copy(q + i * q_dim_, q + (i + 1) * q_dim_, sq);
      RopeAt(sink_pos_[r0 + i], rope_scratch.data(), &cs, &sn);
      cpu::ApplyRope(sq, c.num_heads, c.head_dim, cs, sn, interleaved);
    }
    RopeAt(batch.positions[r0 + i], rope_scratch.data(), &cs, &sn);
    cpu::ApplyRope(q + i * q_dim_, c.num_heads, c.head_dim, cs, sn, interleaved);
    // Low rank: the latents are of unrotated keys (attention rotates them).
    if (!low_rank_)
      cpu::ApplyRope(k + i * kv_dim_, c.num_kv_heads, c.head_dim, cs, sn, interleaved);
  }
  if (RoleOf(kv, layer) == KvCrossRole::kBase) {  // for the shared layer's flush
    std::copy(k, k + n * kv_dim_, base_k_.data() + r0 * kv_dim_);
    std::copy(v, v + n * kv_dim_, base_v_.data() + r0 * kv_dim_);
  }
  // int4_kc: FlushKvBlocks / WriteKvTails; cross layer: CrossLayerFlush / WriteKvTails.
  if (kv.format(layer).has_tails()) return;
  cpu::KvWriteParams wp;
  wp.k = k;
  wp.v = v;
  if (low_rank_) {
    const int64_t w = int64_t{low_rank_->num_groups()} * low_rank_->layers[layer].stored_width();
    wp.k = k_lat_.data() + r0 * w;
    wp.v = v_lat_.data() + r0 * w;
  }
  wp.slot_mapping = batch.slot_mapping.data() + r0;
  wp.num_tokens = static_cast<int32_t>(n);
  wp.kv = LayerView(kv, layer);
  cpu::WriteKv(wp);
}

void CpuForward::AttentionOutput(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t dim = weights_.config.dim, in = AttentionWidth(layer);
  float* x = x_.data() + r0 * dim;
  MatMul(att_.data() + r0 * in, r1 - r0, in, mats_[layer].wo, c0, c1, x + c0, dim,
         /*accumulate=*/true);
  if (low_rank_) {
    const float* bv = bo_low_rank_[layer].data();
    for (int64_t r = 0; r < r1 - r0; ++r) {
      for (int64_t i = c0; i < c1; ++i) x[r * dim + i] += bv[i];
    }
  }
  if (weights_.config.o_bias) {
    const float* bo = weights_.layers[layer].bo.data;
    for (int64_t r = 0; r < r1 - r0; ++r) {
      for (int64_t i = c0; i < c1; ++i) x[r * dim + i] += bo[i];
    }
  }
}

void CpuForward::NormMlp(int layer, int64_t r0, int64_t r1) {
  const ModelConfig& c = weights_.config;
  cpu::RmsNorm(x_.data() + r0 * c.dim, weights_.layers[layer].ffn_norm.data,
               xb_.data() + r0 * c.dim, r1 - r0, c.dim, c.rms_norm_eps);
}

void CpuForward::GateUp(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t dim = weights_.config.dim, hid = weights_.config.hidden_dim;
  const LayerMatrices& m = mats_[layer];
  const float* xb = xb_.data() + r0 * dim;
  float* gate = gate_.data() + r0 * hid;
  float* up = up_.data() + r0 * hid;
  MatMul(xb, r1 - r0, dim, m.w_gate, c0, c1, gate + c0, hid, false);
  MatMul(xb, r1 - r0, dim, m.w_up, c0, c1, up + c0, hid, false);
  if (c0 == 0 && c1 == hid) {
    cpu::SiluMul(gate, up, (r1 - r0) * hid);
  } else {
    for (int64_t r = 0; r < r1 - r0; ++r) {
      cpu::SiluMul(gate + r * hid + c0, up + r * hid + c0, c1 - c0);
    }
  }
}

void CpuForward::Down(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t dim = weights_.config.dim, hid = weights_.config.hidden_dim;
  MatMul(gate_.data() + r0 * hid, r1 - r0, hid, mats_[layer].w_down, c0, c1,
         x_.data() + r0 * dim + c0, dim, /*accumulate=*/true);
}

void CpuForward::AttentionInput(int layer, const BatchInput& batch, HostKvPages& kv, int64_t r0,
                                int64_t r1) {
  if (r1 <= r0) return;
  NormAttention(layer, r0, r1);
  Qkv(layer, r0, r1, 0, q_dim_ + 2 * int64_t{kv_dim_});
  FinishQkv(layer, batch, kv, r0, r1);
}

void CpuForward::AttentionOutputAndMlp(int layer, int64_t r0, int64_t r1) {
  if (r1 <= r0) return;
  const ModelConfig& c = weights_.config;
  AttentionOutput(layer, r0, r1, 0, c.dim);
  NormMlp(layer, r0, r1);
  GateUp(layer, r0, r1, 0, c.hidden_dim);
  Down(layer, r0, r1, 0, c.dim);
}

absl::Status CpuForward::Forward(const BatchInput& batch, HostKvPages& kv,
                                 std::span<float> logits) {
  KV_RETURN_IF_ERROR(Validate(batch, kv, logits));
  if (cross_.enabled()) {
    KV_ASSIGN_OR_RETURN(bool ran, ForwardInRounds(batch, kv, logits));
    if (ran) return absl::OkStatus();
  }
  const ModelConfig& c = weights_.config;
  const int64_t T = batch.num_tokens();
  const int64_t R = static_cast<int64_t>(batch.logits_rows.size());
  if (T == 0) return absl::OkStatus();
  EnsureCapacity(T, R);
  const int64_t dim = c.dim;

  PlanStep(batch);
  PlanEviction(batch);
  const int chunks = row_chunks_;
  const int attn_chunks = static_cast<int>(attn_split_.size()) - 1;

  cpu::Embedding(weights_.tok_embeddings.data, batch.token_ids.data(), T, dim, x_.data());

  cpu::PagedAttentionParams ap;
  ap.q = q_.data();
  ap.out = att_.data();
  ap.batch = ViewOf(batch);
  ap.num_heads = c.num_heads;
  ap.scale = attn_scale_;
  ap.sliding_window = c.sliding_window;
  if (!sink_pos_.empty()) {
    ap.sink_q = sink_q_.data();
    ap.num_sinks = batch.num_sinks.data();
  }
  if (!mass_offset_.empty()) {
    ap.key_mass = row_mass_.data();
    ap.key_mass_offset = mass_offset_.data();
  }
  cpu::LowRankAttentionParams lp;
  if (low_rank_) {
    lp.q = q_.data();
    lp.out = att_.data();
    lp.batch = ap.batch;
    lp.num_heads = c.num_heads;
    lp.num_kv_heads = c.num_kv_heads;
    lp.head_dim = c.head_dim;
    lp.group_heads = low_rank_->group_heads;
    lp.scale = attn_scale_;
    lp.sliding_window = c.sliding_window;
    lp.rope = &rope_;
    lp.inv_freq = inv_freq_.data();
    lp.interleaved = c.rope_style == RopeStyle::kInterleaved;
  }

  // Phase boundaries are the only synchronisation: K/V of every row must be
  // written before any row attends, and attention ranges are split by cost,
  // not like the row ranges, so the MLP waits for all of them. In a split
  // over rows the MLP of layer l and the attention input of layer l + 1
  // share the row ranges and run in one phase; in a split over output
  // features each matrix is a phase and the per-row steps between them run
  // here, on all rows.
  const int64_t qkv_cols = q_dim_ + 2 * int64_t{kv_dim_};
  auto attention_input = [&](int l) {
    if (split_rows_) {
      pool_.Run(chunks, [&](int ch) {
        int64_t r0, r1;
        cpu::SplitRange(T, chunks, ch, &r0, &r1);
        AttentionInput(l, batch, kv, r0, r1);
      });
      return;
    }
    NormAttention(l, 0, T);
    RunColumns(qkv_cols, [&](int64_t c0, int64_t c1) { Qkv(l, 0, T, c0, c1); });
    FinishQkv(l, batch, kv, 0, T);
  };
  attention_input(0);
  // int4_kc layers write around attention (kernels/cpu/attention/paged_attention.h):
  // blocks the step completes before it, partial blocks' rows into tails after.
  cpu::KvBlockWriteParams tp;
  tp.k = k_.data();
  tp.v = v_.data();
  tp.batch = ap.batch;
  ap.new_k = k_.data();
  ap.new_v = v_.data();
  cpu::CrossLayerAttentionParams xp;
  cpu::CrossLayerFlushParams xf;
  if (cross_.enabled()) {
    xp.q = q_.data();
    xp.out = att_.data();
    xp.batch = ap.batch;
    xp.new_k = k_.data();
    xp.new_v = v_.data();
    xp.num_heads = c.num_heads;
    xp.scale = attn_scale_;
    xp.sliding_window = c.sliding_window;
    xf.batch = ap.batch;
    xf.base_k = base_k_.data();
    xf.base_v = base_v_.data();
    xf.shared_k = k_.data();
    xf.shared_v = v_.data();
    xf.threshold = static_cast<float>(cross_.threshold);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    ap.kv = LayerView(kv, l);
    const bool tails = kv.format(l).has_tails();
    const KvCrossRole role = RoleOf(kv, l);
    if (role != KvCrossRole::kNone) {
      xp.role = role;
      xp.base = LayerView(kv, role == KvCrossRole::kBase ? l : l - 1);
      xp.shared = role == KvCrossRole::kShared ? ap.kv : PagedKvView{};
      tp.kv = ap.kv;
    }
    // fn(seq_begin, seq_end) over the batch's sequences, split over the pool.
    auto over_seqs = [&](auto&& fn) {
      const int64_t B = batch.num_seqs();
      const int flush_chunks = static_cast<int>(std::min<int64_t>(chunks, B));
      pool_.Run(flush_chunks, [&](int ch) {
        int64_t b0, b1;
        cpu::SplitRange(B, flush_chunks, ch, &b0, &b1);
        fn(static_cast<int32_t>(b0), static_cast<int32_t>(b1));
      });
    };
    if (role == KvCrossRole::kShared) {  // the blocks the step completes, both layers
      xf.base = xp.base;
      xf.shared = xp.shared;
      over_seqs([&](int32_t b0, int32_t b1) { cpu::CrossLayerFlush(xf, b0, b1); });
    } else if (tails && role == KvCrossRole::kNone) {
      tp.kv = ap.kv;
      over_seqs([&](int32_t b0, int32_t b1) { cpu::FlushKvBlocks(tp, b0, b1); });
    }
    if (low_rank_) {
      const LowRankLayer& lrl = low_rank_->layers[l];
      lp.kv = ap.kv;
      lp.rank_k = lrl.rank_k;
      lp.rank_v = lrl.rank_v;
      lp.k_basis = lrl.k_basis.data();
      lp.k_mean = lrl.k_mean.data();
    }
    pool_.Run(attn_chunks, [&](int ch) {
      if (attn_split_[ch] >= attn_split_[ch + 1]) return;
      if (low_rank_) {
        cpu::LowRankAttention(lp, attn_split_[ch], attn_split_[ch + 1]);
      } else if (role != KvCrossRole::kNone) {
        cpu::CrossLayerAttention(xp, attn_split_[ch], attn_split_[ch + 1]);
      } else {
        cpu::PagedAttention(ap, attn_split_[ch], attn_split_[ch + 1]);
      }
    });
    if (!mass_offset_.empty()) GatherAttentionStats(batch, l);
    if (split_rows_) {
      pool_.Run(chunks, [&](int ch) {
        int64_t r0, r1;
        cpu::SplitRange(T, chunks, ch, &r0, &r1);
        // Before the next layer's K/V overwrite these rows.
        if (tails) cpu::WriteKvTails(tp, static_cast<int32_t>(r0), static_cast<int32_t>(r1));
        AttentionOutputAndMlp(l, r0, r1);
        if (l + 1 < c.num_layers) AttentionInput(l + 1, batch, kv, r0, r1);
      });
      continue;
    }
    RunColumns(dim, [&](int64_t c0, int64_t c1) { AttentionOutput(l, 0, T, c0, c1); });
    if (tails) cpu::WriteKvTails(tp, 0, static_cast<int32_t>(T));
    NormMlp(l, 0, T);
    RunColumns(c.hidden_dim, [&](int64_t c0, int64_t c1) { GateUp(l, 0, T, c0, c1); });
    RunColumns(dim, [&](int64_t c0, int64_t c1) { Down(l, 0, T, c0, c1); });
    if (l + 1 < c.num_layers) attention_input(l + 1);
  }

  if (R == 0) return absl::OkStatus();
  for (int64_t i = 0; i < R; ++i) {
    const float* src = x_.data() + static_cast<int64_t>(batch.logits_rows[i]) * dim;
    std::copy(src, src + dim, final_.begin() + i * dim);
  }
  cpu::RmsNorm(final_.data(), weights_.final_norm.data, final_.data(), R, dim, c.rms_norm_eps);
  // The head splits over vocabulary columns, which works for any number of rows.
  RunColumns(c.vocab_size, [&](int64_t c0, int64_t c1) {
    MatMul(final_.data(), R, dim, output_, c0, c1, logits.data() + c0, c.vocab_size, false);
  });
  return absl::OkStatus();
}

}  // namespace kvserve
