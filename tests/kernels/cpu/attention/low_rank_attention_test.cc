#include "kernels/cpu/attention/low_rank_attention.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/cpu/attention/paged_attention.h"

namespace kvserve {
namespace {

// A naive reference in double: reconstruct each key from its latent, rotate
// it at its cache index (angles computed here, not from the table), softmax,
// and the weighted sum of V latents.
struct Problem {
  int heads = 8, kv_heads = 4, head_dim = 8, group_heads = 2, rank_k = 5, rank_v = 7;
  int groups() const { return kv_heads / group_heads; }
  int gw() const { return group_heads * head_dim; }
  int width() const { return ((rank_k + rank_v + 1) / 2 + 1) / 2 * 2; }
};

}  // namespace

TEST_CASE("LowRankAttention against a naive reference: odd lengths, page sizes, both RoPEs",
          "[kernels]") {
  const Problem pr;
  const int bs = GENERATE(1, 8, 16);
  const bool interleaved = GENERATE(false, true);
  const std::vector<int32_t> lens = {1, 17, 40};  // past the 24-position table, too
  const std::vector<int32_t> new_rows = {1, 5, 40};
  const int32_t window = GENERATE(0, 7);
  CAPTURE(bs, interleaved, window);
  std::mt19937 rng(bs * 7 + interleaved);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);

  const int W = pr.width(), G = pr.groups(), gw = pr.gw();
  std::vector<float> k_basis(static_cast<size_t>(G) * pr.rank_k * gw);
  for (float& x : k_basis) x = u(rng);
  std::vector<float> k_mean(static_cast<size_t>(G) * gw);
  for (float& x : k_mean) x = u(rng);
  auto fmt = KvFormat::Create(KvDtype::kFp32, G, W, bs);
  REQUIRE(fmt.ok());
  int32_t blocks_per_seq = 0;
  for (int32_t l : lens) blocks_per_seq = std::max(blocks_per_seq, (l + bs - 1) / bs);
  const int32_t num_blocks = blocks_per_seq * 3 + 2;
  HostKvPages pages(*fmt, 1, num_blocks);
  // Poison: every slot nobody writes is NaN (all-ones bytes), so reading
  // one shows.
  std::memset(pages.layer(0), 0xff, static_cast<size_t>(num_blocks) * fmt->block_bytes());

  // Latents [seq][token][group][2W] (the tail of each group's 2W zero), the
  // blocks in reverse so that block ids are not the cache order.
  BatchInput batch;
  batch.Clear();
  batch.max_blocks_per_seq = blocks_per_seq;
  std::vector<std::vector<float>> latents(lens.size());
  std::vector<float> k_rows, v_rows;
  std::vector<int64_t> slots;
  int32_t next_block = num_blocks - 1;
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int32_t> table(blocks_per_seq, 0);
    for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) table[b] = next_block--;
    batch.block_table.insert(batch.block_table.end(), table.begin(), table.end());
    latents[s].assign(static_cast<size_t>(lens[s]) * G * 2 * W, 0.0f);
    for (int32_t j = 0; j < lens[s]; ++j) {
      for (int g = 0; g < G; ++g) {
        float* c = latents[s].data() + (static_cast<size_t>(j) * G + g) * 2 * W;
        for (int i = 0; i < pr.rank_k + pr.rank_v; ++i) c[i] = u(rng);
        k_rows.insert(k_rows.end(), c, c + W);
        v_rows.insert(v_rows.end(), c + W, c + 2 * W);
      }
      slots.push_back(int64_t{table[j / bs]} * bs + j % bs);
    }
    const int32_t q = std::min(new_rows[s], lens[s]);
    for (int32_t j = lens[s] - q; j < lens[s]; ++j) batch.positions.push_back(j);
    batch.query_start.push_back(batch.query_start.back() + q);
    batch.context_len.push_back(lens[s]);
  }
  cpu::KvWriteParams wp;
  wp.k = k_rows.data();
  wp.v = v_rows.data();
  wp.slot_mapping = slots.data();
  wp.num_tokens = static_cast<int32_t>(slots.size());
  wp.kv = LayerView(pages, 0);
  cpu::WriteKv(wp);
  batch.token_ids.assign(batch.positions.size(), 0);

  const int32_t T = batch.num_tokens();
  std::vector<float> q(static_cast<size_t>(T) * pr.heads * pr.head_dim);
  for (float& x : q) x = u(rng);
  std::vector<float> out(static_cast<size_t>(T) * pr.heads * pr.rank_v, NAN);
  constexpr float kTheta = 10000.0f;
  const cpu::RopeTable rope(24, pr.head_dim, kTheta);
  std::vector<float> inv_freq(pr.head_dim / 2);
  for (int j = 0; j < pr.head_dim / 2; ++j) {
    inv_freq[j] = 1.0f / powf(kTheta, static_cast<float>(2 * j) / pr.head_dim);
  }
  cpu::LowRankAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.kv = LayerView(pages, 0);
  p.batch = ViewOf(batch);
  p.num_heads = pr.heads;
  p.num_kv_heads = pr.kv_heads;
  p.head_dim = pr.head_dim;
  p.group_heads = pr.group_heads;
  p.rank_k = pr.rank_k;
  p.rank_v = pr.rank_v;
  p.k_basis = k_basis.data();
  p.k_mean = k_mean.data();
  p.scale = 0.35f;
  p.sliding_window = window;
  p.rope = &rope;
  p.inv_freq = inv_freq.data();
  p.interleaved = interleaved;
  // Two calls on a split of the rows, as the forward pass's threads do.
  cpu::LowRankAttention(p, 0, 9);
  cpu::LowRankAttention(p, 9, T);

  const int hd = pr.head_dim, q_per_kv = pr.heads / pr.kv_heads;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int32_t r = batch.query_start[s]; r < batch.query_start[s + 1]; ++r) {
      const int32_t i = lens[s] - (batch.query_start[s + 1] - r);
      const int32_t lo = window > 0 ? std::max(0, i - window + 1) : 0;
      for (int h = 0; h < pr.heads; ++h) {
        const int kvh = h / q_per_kv, g = kvh / pr.group_heads, off = (kvh % pr.group_heads) * hd;
        std::vector<double> score;
        for (int32_t j = lo; j <= i; ++j) {
          const float* c = latents[s].data() + (static_cast<size_t>(j) * G + g) * 2 * W;
          std::vector<double> k(hd, 0.0);
          for (int e = 0; e < hd; ++e) {
            k[e] = k_mean[static_cast<size_t>(g) * gw + off + e];
            for (int t = 0; t < pr.rank_k; ++t) {
              k[e] +=
                  double{c[t]} * k_basis[(static_cast<size_t>(g) * pr.rank_k + t) * gw + off + e];
            }
          }
          std::vector<double> kr = k;
          for (int m = 0; m < hd / 2; ++m) {
            const double angle = j * double{inv_freq[m]};
            const int a = interleaved ? 2 * m : m, b = interleaved ? 2 * m + 1 : m + hd / 2;
            kr[a] = k[a] * std::cos(angle) - k[b] * std::sin(angle);
            kr[b] = k[a] * std::sin(angle) + k[b] * std::cos(angle);
          }
          double dot = 0;
          for (int e = 0; e < hd; ++e)
            dot += q[(static_cast<size_t>(r) * pr.heads + h) * hd + e] * kr[e];
          score.push_back(dot * p.scale);
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& x : score) sum += (x = std::exp(x - mx));
        for (int t = 0; t < pr.rank_v; ++t) {
          double want = 0;
          for (int32_t j = lo; j <= i; ++j) {
            const float* c = latents[s].data() + (static_cast<size_t>(j) * G + g) * 2 * W;
            want += score[j - lo] / sum * c[pr.rank_k + t];
          }
          const float got = out[(static_cast<size_t>(r) * pr.heads + h) * pr.rank_v + t];
          // fp32 sums of at most 40 terms of magnitude <= 8: 1e-5 is about
          // 100 ulps of the result.
          REQUIRE(got == Approx(want).margin(1e-5));
        }
      }
    }
  }
}

}  // namespace kvserve
