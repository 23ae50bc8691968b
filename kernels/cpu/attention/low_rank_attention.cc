#include "kernels/cpu/attention/low_rank_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {
namespace {

void CheckShapes(const LowRankAttentionParams& p) {
  const KvPageLayout& f = p.kv.layout;
  const bool ok = p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 &&
                  p.group_heads > 0 && p.num_kv_heads % p.group_heads == 0 &&
                  f.num_kv_heads == p.num_kv_heads / p.group_heads && p.rank_k >= 1 &&
                  p.rank_v >= 1 && p.rank_k + p.rank_v <= 2 * f.head_dim && p.k_basis != nullptr &&
                  p.rope != nullptr && !f.has_tails();
  if (!ok) {
    std::fprintf(stderr,
                 "LowRankAttention: inconsistent shapes (%d heads, %d kv heads, groups of %d, "
                 "ranks %d/%d, pages of %d groups x %d)\n",
                 p.num_heads, p.num_kv_heads, p.group_heads, p.rank_k, p.rank_v, f.num_kv_heads,
                 f.head_dim);
    std::abort();
  }
}

// cos / sin at pos: the table's row, or computed as the table computes it.
void RopeAt(const LowRankAttentionParams& p, int32_t pos, float* scratch, const float** cos,
            const float** sin) {
  if (pos < p.rope->max_positions()) {
    *cos = p.rope->cos(pos);
    *sin = p.rope->sin(pos);
    return;
  }
  const int half = p.rope->half_dim();
  for (int j = 0; j < half; ++j) {
    const float val = static_cast<float>(pos) * p.inv_freq[j];
    scratch[j] = cosf(val);
    scratch[half + j] = sinf(val);
  }
  *cos = scratch;
  *sin = scratch + half;
}

}  // namespace

void LowRankAttention(const LowRankAttentionParams& p, int32_t row_begin, int32_t row_end) {
  if (row_begin >= row_end) return;
  CheckShapes(p);
  const KvPageLayout& f = p.kv.layout;
  const BatchView& batch = p.batch;
  const int bs = f.block_size, width = f.head_dim, groups = f.num_kv_heads;
  const int hd = p.head_dim, nh = p.num_heads, q_per_kv = p.num_heads / p.num_kv_heads;
  const int gw = p.group_heads * hd, kv_dim = p.num_kv_heads * hd;
  const int rk = p.rank_k, rv = p.rank_v;
  thread_local std::vector<float> keys, vlat, latent, scores, rope_scratch;
  latent.resize(2 * width);
  rope_scratch.resize(hd);
  for (int32_t r = row_begin; r < row_end;) {
    const int32_t b = batch.SeqOfRow(r);
    const int32_t seg_end = std::min(row_end, batch.query_start[b + 1]);
    const int32_t first = batch.CacheIndex(b, r), last = batch.CacheIndex(b, seg_end - 1);
    const int32_t lo = KeyBegin(first, p.sliding_window);
    const int32_t n = last - lo + 1;
    const int32_t* table = batch.BlockRow(b);
    keys.resize(static_cast<size_t>(n) * kv_dim);
    vlat.resize(static_cast<size_t>(n) * groups * rv);
    for (int32_t j = lo; j <= last; ++j) {
      const uint8_t* block = p.kv.Block(table[j / bs]);
      float* key = keys.data() + static_cast<size_t>(j - lo) * kv_dim;
      for (int g = 0; g < groups; ++g) {
        // The group's [z_k | z_v]: the K row, then the V row.
        DequantizeRow(f.k, width, block + f.RowOffset(f.k, g, j % bs),
                      block + f.MetaOffset(f.k, g, j % bs), latent.data());
        DequantizeRow(f.v, width, block + f.RowOffset(f.v, g, j % bs),
                      block + f.MetaOffset(f.v, g, j % bs), latent.data() + width);
        float* kg = key + g * gw;
        if (p.k_mean != nullptr) {
          std::copy(p.k_mean + g * gw, p.k_mean + (g + 1) * gw, kg);
        } else {
          std::fill(kg, kg + gw, 0.0f);
        }
        const float* basis = p.k_basis + static_cast<size_t>(g) * rk * gw;
        for (int c = 0; c < rk; ++c) {
          const float z = latent[c];
          const float* row = basis + static_cast<size_t>(c) * gw;
          for (int e = 0; e < gw; ++e) kg[e] += z * row[e];
        }
        std::copy(latent.begin() + rk, latent.begin() + rk + rv,
                  vlat.begin() + (static_cast<size_t>(j - lo) * groups + g) * rv);
      }
      const float* cs;
      const float* sn;
      RopeAt(p, j, rope_scratch.data(), &cs, &sn);
      ApplyRope(key, p.num_kv_heads, hd, cs, sn, p.interleaved);
    }
    for (int32_t row = r; row < seg_end; ++row) {
      const int32_t idx = batch.CacheIndex(b, row);
      const int32_t klo = KeyBegin(idx, p.sliding_window);
      const int32_t m = idx - klo + 1;
      scores.resize(m);
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / q_per_kv, g = kvh / p.group_heads;
        const float* q = p.q + (static_cast<size_t>(row) * nh + h) * hd;
        float mx = -INFINITY;
        for (int32_t j = klo; j <= idx; ++j) {
          const float* k = keys.data() + static_cast<size_t>(j - lo) * kv_dim + kvh * hd;
          float s = 0;
          for (int e = 0; e < hd; ++e) s += q[e] * k[e];
          s *= p.scale;
          scores[j - klo] = s;
          mx = std::max(mx, s);
        }
        float sum = 0;
        for (int32_t t = 0; t < m; ++t) {
          scores[t] = expf(scores[t] - mx);
          sum += scores[t];
        }
        const float inv = 1.0f / sum;
        float* out = p.out + (static_cast<size_t>(row) * nh + h) * rv;
        std::fill(out, out + rv, 0.0f);
        for (int32_t j = klo; j <= idx; ++j) {
          const float w = scores[j - klo] * inv;
          const float* z = vlat.data() + (static_cast<size_t>(j - lo) * groups + g) * rv;
          for (int c = 0; c < rv; ++c) out[c] += w * z[c];
        }
      }
    }
    r = seg_end;
  }
}

}  // namespace kvserve::cpu
