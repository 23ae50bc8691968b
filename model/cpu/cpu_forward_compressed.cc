// CpuForward's compressed-KV paths (model/cpu/cpu_forward.h): low-rank K/V
// (cache.low_rank: the output projection folded into the latent basis at
// load, latents projected per step, the batch checks) and cross-layer KV
// (cache.cross_layer: the batch checks and the forward in rounds at block
// boundaries, where merged layers are written).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention/cross_layer_attention.h"
#include "kernels/cpu/attention/low_rank_attention.h"
#include "kernels/cpu/layers/gemm.h"
#include "model/batch_check.h"
#include "model/cpu/cpu_forward.h"
#include "util/status_macros.h"

namespace kvserve {

void CpuForward::FoldLowRank() {
  // V of kv head kvh is sum_r z_r B_v[g][r][o + e] (o: the head's offset in
  // its group), so head h's share of the output projection,
  // sum_e Wo[d][h * hd + e] v[e], is sum_r z_r W_o'[d][h * rank_v + r] with
  // W_o'[d][h * rank_v + r] = sum_e Wo[d][h * hd + e] B_v[g][r][o + e].
  const ModelConfig& c = weights_.config;
  const LowRankKv& lr = *low_rank_;
  const int hd = c.head_dim, q_per_kv = c.num_heads / c.num_kv_heads, gw = lr.group_width();
  att_width_ = 0;
  latent_width_ = 0;
  wo_low_rank_.resize(c.num_layers);
  bo_low_rank_.assign(c.num_layers, std::vector<float>(c.dim, 0.0f));
  for (int l = 0; l < c.num_layers; ++l) {
    const LowRankLayer& layer = lr.layers[l];
    const int rv = layer.rank_v;
    const int64_t in = int64_t{c.num_heads} * rv;
    att_width_ = std::max(att_width_, in);
    latent_width_ =
        std::max<int64_t>(latent_width_, int64_t{lr.num_groups()} * layer.stored_width());
    std::vector<float>& w = wo_low_rank_[l];
    w.assign(static_cast<size_t>(c.dim) * in, 0.0f);
    const float* wo = weights_.layers[l].wo.data;  // [dim][q_dim]
    for (int h = 0; h < c.num_heads; ++h) {
      const int kvh = h / q_per_kv, g = kvh / lr.group_heads, o = (kvh % lr.group_heads) * hd;
      for (int r = 0; r < rv; ++r) {
        const float* basis = layer.v_basis.data() + (static_cast<size_t>(g) * rv + r) * gw + o;
        for (int d = 0; d < c.dim; ++d) {
          const float* wrow = wo + static_cast<size_t>(d) * q_dim_ + h * hd;
          double acc = 0;
          for (int e = 0; e < hd; ++e) acc += double{wrow[e]} * basis[e];
          w[static_cast<size_t>(d) * in + h * rv + r] = static_cast<float>(acc);
        }
      }
    }
    mats_[l].wo = Matrix{w.data(), nullptr};
    // V's mean: the attention weights sum to 1, so every head's output
    // carries it whole; its share of the output projection is a bias.
    for (int d = 0; d < c.dim; ++d) {
      double acc = 0;
      for (int h = 0; h < c.num_heads; ++h) {
        const int kvh = h / q_per_kv, g = kvh / lr.group_heads, o = (kvh % lr.group_heads) * hd;
        const float* mean = layer.v_mean.data() + static_cast<size_t>(g) * gw + o;
        const float* wrow = wo + static_cast<size_t>(d) * q_dim_ + h * hd;
        for (int e = 0; e < hd; ++e) acc += double{wrow[e]} * mean[e];
      }
      bo_low_rank_[l][d] = static_cast<float>(acc);
    }
  }
}

void CpuForward::ProjectLatents(int layer, int64_t r0, int64_t r1) {
  const LowRankKv& lr = *low_rank_;
  const LowRankLayer& l = lr.layers[layer];
  const int groups = lr.num_groups(), gw = lr.group_width(), width = l.stored_width();
  const int64_t row_width = int64_t{groups} * width;
  for (int64_t r = r0; r < r1; ++r) {
    std::fill(k_lat_.data() + r * row_width, k_lat_.data() + (r + 1) * row_width, 0.0f);
    std::fill(v_lat_.data() + r * row_width, v_lat_.data() + (r + 1) * row_width, 0.0f);
    for (int g = 0; g < groups; ++g) {
      // Latent value i of the group's [z_k | z_v] goes to the K row at
      // i < width, to the V row at i - width after (low_rank_kv.h).
      auto out = [&](int i) -> float& {
        return i < width ? k_lat_[r * row_width + g * width + i]
                         : v_lat_[r * row_width + g * width + i - width];
      };
      for (int part = 0; part < 2; ++part) {
        const float* x = (part == 0 ? k_ : v_).data() + r * kv_dim_ + int64_t{g} * gw;
        const int rank = part == 0 ? l.rank_k : l.rank_v;
        const float* basis = (part == 0 ? l.k_encoder : l.v_encoder).data();
        const float* mean = (part == 0 ? l.k_mean : l.v_mean).data() + int64_t{g} * gw;
        for (int c = 0; c < rank; ++c) {
          const float* b = basis + (static_cast<size_t>(g) * rank + c) * gw;
          float acc = 0;
          for (int e = 0; e < gw; ++e) acc += b[e] * (x[e] - mean[e]);
          out(part == 0 ? c : l.rank_k + c) = acc;
        }
      }
    }
  }
}

absl::Status CpuForward::ValidateLowRank(const BatchInput& batch, const HostKvPages& kv) const {
  const LowRankKv& lr = *low_rank_;
  if (kv.num_layers() != lr.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("cache.low_rank: KV pages of ", kv.num_layers(),
                                                   " layers for ", lr.num_layers));
  }
  for (int l = 0; l < lr.num_layers; ++l) {
    const KvFormat& f = kv.format(l);
    if (f.num_kv_heads() != lr.num_groups() || f.head_dim() != lr.layers[l].stored_width() ||
        f.has_tails()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cache.low_rank: layer ", l, "'s KV pages (", f.num_kv_heads(), " heads of ",
                       f.head_dim(), f.has_tails() ? ", with tails" : "", ") are not its latents (",
                       lr.num_groups(), " groups of ", lr.layers[l].stored_width(), ")"));
    }
  }
  for (int32_t n : batch.num_sinks) {
    if (n > 0) return absl::InvalidArgumentError("cache.low_rank: KV eviction (sinks) is refused");
  }
  for (auto a : batch.attention_stats) {
    if (a) return absl::InvalidArgumentError("cache.low_rank: attention statistics are refused");
  }
  // Keys are rotated at their cache index: a row's position must be it.
  const int32_t B = batch.num_seqs();
  for (int32_t b = 0; b < B; ++b) {
    const int32_t first = batch.context_len[b] - (batch.query_start[b + 1] - batch.query_start[b]);
    for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
      if (batch.positions[r] != first + (r - batch.query_start[b])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cache.low_rank: row ", r, " has position ", batch.positions[r], " at cache index ",
            first + (r - batch.query_start[b]), "; low-rank keys sit at their cache index"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuForward::ValidateCrossLayer(const BatchInput& batch, const HostKvPages& kv) const {
  const int n = kv.num_layers();
  for (int l = 0; l < n; ++l) {
    const KvCrossRole want = cross_.RoleOf(l, n), have = RoleOf(kv, l);
    if (want != have) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cache.cross_layer: layer ", l, "'s KV pages are ",
          have == KvCrossRole::kNone   ? "plain"
          : have == KvCrossRole::kBase ? "a base"
                                       : "shared",
          " pages, the setting (", cross_.enabled() ? cross_.ToString() : "off", ") makes it ",
          want == KvCrossRole::kNone   ? "plain"
          : want == KvCrossRole::kBase ? "a base"
                                       : "shared"));
    }
  }
  if (!cross_.enabled()) return absl::OkStatus();
  for (int32_t s : batch.num_sinks) {
    if (s > 0)
      return absl::InvalidArgumentError("cache.cross_layer: KV eviction (sinks) is refused");
  }
  for (auto a : batch.attention_stats) {
    if (a) return absl::InvalidArgumentError("cache.cross_layer: attention statistics are refused");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CpuForward::ForwardInRounds(const BatchInput& batch, HostKvPages& kv,
                                                 std::span<float> logits) {
  const int32_t bs = kv.format().block_size(), B = batch.num_seqs();
  const BatchView view = ViewOf(batch);
  int32_t rounds = 1;
  for (int32_t b = 0; b < B; ++b) {
    if (view.QueryLen(b) == 0) continue;
    rounds = std::max(rounds, (batch.context_len[b] - 1) / bs - view.FirstIndex(b) / bs + 1);
  }
  if (rounds == 1) return false;
  const int vocab = weights_.config.vocab_size;
  for (int32_t k = 0; k < rounds; ++k) {
    // Round k: the rows of each sequence's k-th block from its first new one.
    BatchInput& rb = round_;
    rb.Clear();
    rb.max_blocks_per_seq = batch.max_blocks_per_seq;
    std::vector<int32_t> logit_of;  // round logits row -> the batch's
    size_t next_logit = 0;
    for (int32_t b = 0; b < B; ++b) {
      const int32_t first = view.FirstIndex(b), ctx = batch.context_len[b];
      const int32_t lo = std::max(first, (first / bs + k) * bs);
      const int32_t hi = std::min(ctx, (first / bs + k + 1) * bs);
      const int32_t r0 = batch.query_start[b];
      // Past the sequence's rows of earlier rounds (all of them once it is done).
      while (next_logit < batch.logits_rows.size() &&
             batch.logits_rows[next_logit] < r0 + (std::min(lo, hi) - first)) {
        ++next_logit;
      }
      if (lo >= hi) continue;
      for (int32_t i = lo; i < hi; ++i) {
        const int32_t r = r0 + (i - first);
        if (next_logit < batch.logits_rows.size() && batch.logits_rows[next_logit] == r) {
          rb.logits_rows.push_back(rb.num_tokens());
          logit_of.push_back(static_cast<int32_t>(next_logit++));
        }
        rb.token_ids.push_back(batch.token_ids[r]);
        rb.positions.push_back(batch.positions[r]);
        rb.slot_mapping.push_back(batch.slot_mapping[r]);
      }
      rb.query_start.push_back(rb.num_tokens());
      rb.context_len.push_back(hi);
      rb.block_table.insert(rb.block_table.end(), batch.BlockRow(b),
                            batch.BlockRow(b) + batch.max_blocks_per_seq);
      if (!batch.tail_ids.empty()) rb.tail_ids.push_back(batch.tail_ids[b]);
    }
    round_logits_.resize(rb.logits_rows.size() * static_cast<size_t>(vocab));
    // One block per sequence: this Forward runs the round itself.
    KV_RETURN_IF_ERROR(Forward(rb, kv, round_logits_));
    for (size_t i = 0; i < logit_of.size(); ++i) {
      std::copy(round_logits_.begin() + i * vocab, round_logits_.begin() + (i + 1) * vocab,
                logits.begin() + static_cast<size_t>(logit_of[i]) * vocab);
    }
  }
  return true;
}

}  // namespace kvserve
