// Cross-layer KV sharing (kernels/cpu/attention/cross_layer_attention.h):
// equal layers reconstruct exactly, the retention rule (largest distances,
// ties by slot, the rest merged), the SLERP midpoint, the flush from tails
// and new rows against a direct merge, and both layers' attention against a
// naive reference over the reconstructed keys and values (odd lengths, page
// sizes 8 and 16, retained and demoted tokens, a sliding window).
#include "kernels/cpu/attention/cross_layer_attention.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"

namespace kvserve::cpu {
namespace {

// Two layers: a base and a shared page of dtype, retain_slots kept.
std::vector<KvFormat> PairFormats(KvDtype dtype, int kv_heads, int hd, int bs, int retain) {
  absl::StatusOr<KvFormat> plain = KvFormat::Create(dtype, kv_heads, hd, bs);
  REQUIRE(plain.ok());
  absl::StatusOr<KvFormat> base = KvFormat::ForCrossLayer(*plain, KvCrossRole::kBase, retain);
  absl::StatusOr<KvFormat> shared = KvFormat::ForCrossLayer(*plain, KvCrossRole::kShared, retain);
  REQUIRE(base.ok());
  REQUIRE(shared.ok());
  return {*base, *shared};
}

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

CrossLayerBlockRows RowsOf(const std::vector<float>& bk, const std::vector<float>& bv,
                           const std::vector<float>& sk, const std::vector<float>& sv) {
  return {bk.data(), bv.data(), sk.data(), sv.data()};
}

}  // namespace

TEST_CASE("cross-layer: equal layers reconstruct exactly, merged, ratio 1", "[kernels]") {
  const int kvh = 4, hd = 8, bs = 16;
  const KvDtype dtype = GENERATE(KvDtype::kFp32, KvDtype::kInt8, KvDtype::kFp16);
  CAPTURE(KvDtypeName(dtype));
  const std::vector<KvFormat> f = PairFormats(dtype, kvh, hd, bs, 2);
  HostKvPages pages(f, 1, 1);
  std::mt19937 rng(1);
  const size_t n = size_t{bs} * kvh * hd;
  const std::vector<float> k = Random(rng, n), v = Random(rng, n);
  MergeCrossLayerBlock(f[0].layout(), f[1].layout(), RowsOf(k, v, k, v), 0.0f, pages.block(0, 0),
                       pages.block(1, 0));
  const uint8_t* index = pages.block(1, 0) + f[1].layout().cross.index_offset;
  for (int t = 0; t < bs; ++t) REQUIRE(index[t] == kCrossMerged);
  std::vector<float> bk(n), bv(n), sk(n), sv(n);
  ReconstructCrossLayerBlock(f[0].layout(), f[1].layout(), pages.block(0, 0), pages.block(1, 0),
                             bk.data(), bv.data(), sk.data(), sv.data());
  // Layer l+1 is layer l's decoded rows times 1: bit for bit.
  REQUIRE(std::memcmp(bk.data(), sk.data(), n * sizeof(float)) == 0);
  REQUIRE(std::memcmp(bv.data(), sv.data(), n * sizeof(float)) == 0);
  if (dtype == KvDtype::kFp32) {
    REQUIRE(std::memcmp(bk.data(), k.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(bv.data(), v.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("cross-layer: the farthest tokens are kept, ties by slot, the others merged",
          "[kernels]") {
  const int kvh = 2, hd = 4, bs = 8, retain = 2;
  const std::vector<KvFormat> f = PairFormats(KvDtype::kFp32, kvh, hd, bs, retain);
  HostKvPages pages(f, 1, 1);
  // Every head's K and V: layer l along e0 (magnitude 2), layer l+1 at angle
  // a_t from it (magnitude 3), so token t's distance is a_t / pi.
  const float pi = static_cast<float>(M_PI);
  const std::vector<float> angle = {0.0f,      0.4f * pi, 0.05f * pi, 0.4f * pi,
                                    0.1f * pi, 0.6f * pi, 0.2f * pi,  0.15f * pi};
  const size_t n = size_t{bs} * kvh * hd;
  std::vector<float> x1(n, 0.0f), x2(n, 0.0f);
  for (int t = 0; t < bs; ++t) {
    for (int h = 0; h < kvh; ++h) {
      const size_t o = (size_t{static_cast<size_t>(t)} * kvh + h) * hd;
      x1[o] = 2.0f;
      x2[o] = 3.0f * std::cos(angle[t]);
      x2[o + 1] = 3.0f * std::sin(angle[t]);
    }
  }
  const CrossLayerBlockRows rows = RowsOf(x1, x1, x2, x2);
  for (int t = 0; t < bs; ++t) {
    CHECK(CrossLayerDistance(rows, kvh, hd, t) == Approx(angle[t] / pi).margin(1e-6));
  }
  // Threshold 0.12: candidates 1, 3, 5, 6, 7; kept: 5 (0.6), then 1 (0.4,
  // before 3 by slot); 3, 6 and 7 are merged anyway.
  MergeCrossLayerBlock(f[0].layout(), f[1].layout(), rows, 0.12f, pages.block(0, 0),
                       pages.block(1, 0));
  const uint8_t* index = pages.block(1, 0) + f[1].layout().cross.index_offset;
  const std::vector<uint8_t> want = {kCrossMerged, 0, kCrossMerged, kCrossMerged,
                                     kCrossMerged, 1, kCrossMerged, kCrossMerged};
  REQUIRE(std::vector<uint8_t>(index, index + bs) == want);
  std::vector<float> bk(n), bv(n), sk(n), sv(n);
  ReconstructCrossLayerBlock(f[0].layout(), f[1].layout(), pages.block(0, 0), pages.block(1, 0),
                             bk.data(), bv.data(), sk.data(), sv.data());
  for (int t = 0; t < bs; ++t) {
    CAPTURE(t);
    const size_t o = size_t{static_cast<size_t>(t)} * kvh * hd;  // head 0
    if (index[t] != kCrossMerged) {                              // both layers whole
      CHECK(bk[o] == x1[o]);
      CHECK(sk[o] == x2[o]);
      CHECK(sk[o + 1] == x2[o + 1]);
      continue;
    }
    // Merged: both on the midpoint direction, each at its own magnitude
    // (the ratio in fp16).
    const float half = angle[t] / 2;
    CHECK(bk[o] == Approx(2.0f * std::cos(half)).margin(1e-6));
    CHECK(bk[o + 1] == Approx(2.0f * std::sin(half)).margin(1e-6));
    CHECK(sk[o] == Approx(3.0f * std::cos(half)).epsilon(1e-3).margin(1e-6));
    CHECK(sk[o + 1] == Approx(3.0f * std::sin(half)).epsilon(1e-3).margin(1e-6));
  }
}

namespace {

// One sequence of ctx tokens over a pair: blocks below the own block of the
// step's first new index merged (as the flush leaves them), the own block's
// older rows in the tails, the step's rows new; and what a row should see.
struct PairProblem {
  int heads = 8, kvh = 4, hd = 8;
  int bs = 8, retain = 2;
  KvDtype dtype = KvDtype::kFp32;
  int32_t ctx = 0, q_len = 0;
};

struct PairCase {
  std::vector<KvFormat> formats;
  std::unique_ptr<HostKvPages> pages;
  BatchInput batch;
  std::vector<float> k[2], v[2];          // [ctx][kvh][hd]: each layer's full rows
  std::vector<float> ref_k[2], ref_v[2];  // what a row of the last block sees
  int retained = 0, merged = 0;           // tokens of the merged blocks
};

PairCase BuildCase(const PairProblem& pr, std::mt19937& rng) {
  PairCase c;
  c.formats = PairFormats(pr.dtype, pr.kvh, pr.hd, pr.bs, pr.retain);
  const int32_t blocks = (pr.ctx + pr.bs - 1) / pr.bs;
  c.pages = std::make_unique<HostKvPages>(c.formats, blocks + 2, 2);
  // Poison: unwritten bytes are NaN.
  for (int l = 0; l < 2; ++l) {
    std::memset(c.pages->layer(l), 0xff,
                static_cast<size_t>(blocks + 2) * c.formats[l].block_bytes());
    std::memset(c.pages->tails(l), 0xff, 2 * c.formats[l].tail_block_bytes());
  }
  const size_t width = size_t{static_cast<size_t>(pr.kvh)} * pr.hd;
  for (int l = 0; l < 2; ++l) {
    c.k[l] = Random(rng, pr.ctx * width);
    c.v[l] = Random(rng, pr.ctx * width);
  }
  // Layer l+1 near layer l for most tokens (so some merge, some not).
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int32_t t = 0; t < pr.ctx; ++t) {
    const float mix = u(rng) < 0.7f ? 0.1f : 1.0f;
    for (size_t e = 0; e < width; ++e) {
      c.k[1][t * width + e] = c.k[0][t * width + e] * 1.5f + mix * c.k[1][t * width + e];
      c.v[1][t * width + e] = c.v[0][t * width + e] * 0.5f + mix * c.v[1][t * width + e];
    }
  }
  BatchInput& b = c.batch;
  b.Clear();
  b.max_blocks_per_seq = blocks;
  for (int32_t i = 0; i < blocks; ++i) b.block_table.push_back(blocks - i);  // not in order
  b.context_len = {pr.ctx};
  b.query_start = {0, pr.q_len};
  b.tail_ids = {1};
  const int32_t first = pr.ctx - pr.q_len;
  for (int l = 0; l < 2; ++l) {
    c.ref_k[l] = c.k[l];
    c.ref_v[l] = c.v[l];
  }
  // Full blocks below first's block: merged directly.
  const int32_t own = first / pr.bs;
  for (int32_t kb = 0; kb < own; ++kb) {
    const size_t o = size_t{static_cast<size_t>(kb)} * pr.bs * width;
    const CrossLayerBlockRows rows{c.k[0].data() + o, c.v[0].data() + o, c.k[1].data() + o,
                                   c.v[1].data() + o};
    const int32_t id = b.block_table[kb];
    MergeCrossLayerBlock(c.formats[0].layout(), c.formats[1].layout(), rows, 0.05f,
                         c.pages->block(0, id), c.pages->block(1, id));
    ReconstructCrossLayerBlock(c.formats[0].layout(), c.formats[1].layout(), c.pages->block(0, id),
                               c.pages->block(1, id), c.ref_k[0].data() + o, c.ref_v[0].data() + o,
                               c.ref_k[1].data() + o, c.ref_v[1].data() + o);
    const uint8_t* index = c.pages->block(1, id) + c.formats[1].layout().cross.index_offset;
    for (int t = 0; t < pr.bs; ++t) ++(index[t] == kCrossMerged ? c.merged : c.retained);
  }
  // The own block's rows before first: in the tails.
  for (int32_t i = own * pr.bs; i < first; ++i) {
    for (int l = 0; l < 2; ++l) {
      const KvPageLayout& f = c.formats[l].layout();
      for (int h = 0; h < pr.kvh; ++h) {
        std::memcpy(c.pages->tail(l, 1) + f.TailRowOffset(false, h, i % pr.bs),
                    c.k[l].data() + (i * width + h * pr.hd), pr.hd * sizeof(float));
        std::memcpy(c.pages->tail(l, 1) + f.TailRowOffset(true, h, i % pr.bs),
                    c.v[l].data() + (i * width + h * pr.hd), pr.hd * sizeof(float));
      }
    }
  }
  return c;
}

// Attention in double of query rows over keys [KeyBegin(i), i].
std::vector<float> Reference(const PairProblem& pr, const std::vector<float>& q,
                             const std::vector<float>& keys, const std::vector<float>& vals,
                             int32_t window) {
  const int32_t first = pr.ctx - pr.q_len;
  const int width = pr.kvh * pr.hd, per_kv = pr.heads / pr.kvh;
  std::vector<float> out(static_cast<size_t>(pr.q_len) * pr.heads * pr.hd);
  for (int32_t r = 0; r < pr.q_len; ++r) {
    const int32_t i = first + r;
    const int32_t lo = window > 0 ? std::max(0, i - window + 1) : 0;
    for (int h = 0; h < pr.heads; ++h) {
      const float* qh = q.data() + (static_cast<size_t>(r) * pr.heads + h) * pr.hd;
      const int kvh = h / per_kv;
      std::vector<double> s;
      double mx = -1e300;
      for (int32_t j = lo; j <= i; ++j) {
        double d = 0;
        for (int e = 0; e < pr.hd; ++e) d += double{qh[e]} * keys[j * width + kvh * pr.hd + e];
        s.push_back(d / std::sqrt(double{static_cast<double>(pr.hd)}));
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int e = 0; e < pr.hd; ++e) {
        double acc = 0;
        for (int32_t j = lo; j <= i; ++j)
          acc += s[j - lo] / sum * vals[j * width + kvh * pr.hd + e];
        out[(static_cast<size_t>(r) * pr.heads + h) * pr.hd + e] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("CrossLayerAttention against a naive reference over the reconstructed rows",
          "[kernels]") {
  PairProblem pr;
  pr.bs = GENERATE(8, 16);
  pr.dtype = GENERATE(KvDtype::kFp32, KvDtype::kInt8);
  pr.ctx = GENERATE(1, 17, 40, 97);
  const int32_t window = GENERATE(0, 11);
  // The step's rows stay in the last block (the runner's rounds).
  pr.q_len = std::min<int32_t>(GENERATE(1, 5), (pr.ctx - 1) % pr.bs + 1);
  CAPTURE(pr.bs, KvDtypeName(pr.dtype), pr.ctx, pr.q_len, window);
  std::mt19937 rng(pr.ctx * 31 + pr.bs);
  PairCase c = BuildCase(pr, rng);
  if (pr.ctx >= 40) {  // both kinds of token among the merged blocks
    REQUIRE(c.retained > 0);
    REQUIRE(c.merged > c.retained);
  }
  const std::vector<float> q = Random(rng, static_cast<size_t>(pr.q_len) * pr.heads * pr.hd);
  const size_t width = size_t{static_cast<size_t>(pr.kvh)} * pr.hd;
  const int32_t first = pr.ctx - pr.q_len;
  for (int role = 0; role < 2; ++role) {
    CAPTURE(role);
    CrossLayerAttentionParams p;
    p.q = q.data();
    std::vector<float> out(q.size(), NAN);
    p.out = out.data();
    p.base = LayerView(*c.pages, 0);
    p.shared = LayerView(*c.pages, 1);
    p.role = role == 0 ? KvCrossRole::kBase : KvCrossRole::kShared;
    p.batch = ViewOf(c.batch);
    p.new_k = c.k[role].data() + first * width;
    p.new_v = c.v[role].data() + first * width;
    p.num_heads = pr.heads;
    p.scale = 1.0f / std::sqrt(static_cast<float>(pr.hd));
    p.sliding_window = window;
    CrossLayerAttention(p, 0, pr.q_len);
    const std::vector<float> want = Reference(pr, q, c.ref_k[role], c.ref_v[role], window);
    for (size_t e = 0; e < out.size(); ++e) REQUIRE(out[e] == Approx(want[e]).margin(2e-6));
  }
}

TEST_CASE("CrossLayerFlush: a block completed from tail and new rows is the direct merge",
          "[kernels]") {
  PairProblem pr;
  pr.bs = 8;
  pr.dtype = GENERATE(KvDtype::kFp32, KvDtype::kInt8);
  pr.ctx = 24;
  pr.q_len = 5;  // indices 19 .. 23 complete block 2 (from the tail's 16 .. 18)
  std::mt19937 rng(7);
  PairCase c = BuildCase(pr, rng);
  const size_t width = size_t{static_cast<size_t>(pr.kvh)} * pr.hd;
  const int32_t first = pr.ctx - pr.q_len;
  CrossLayerFlushParams fp;
  fp.base = LayerView(*c.pages, 0);
  fp.shared = LayerView(*c.pages, 1);
  fp.batch = ViewOf(c.batch);
  fp.base_k = c.k[0].data() + first * width;
  fp.base_v = c.v[0].data() + first * width;
  fp.shared_k = c.k[1].data() + first * width;
  fp.shared_v = c.v[1].data() + first * width;
  fp.threshold = 0.05f;
  CrossLayerFlush(fp, 0, 1);
  const std::vector<KvFormat>& f = c.formats;
  HostKvPages direct(f, 1, 0);
  const size_t o = 2 * size_t{static_cast<size_t>(pr.bs)} * width;
  MergeCrossLayerBlock(f[0].layout(), f[1].layout(),
                       {c.k[0].data() + o, c.v[0].data() + o, c.k[1].data() + o, c.v[1].data() + o},
                       0.05f, direct.block(0, 0), direct.block(1, 0));
  const int32_t id = c.batch.block_table[2];
  // The base page: every row and scale; the shared page: ratios and index
  // (and the retention rows that the index names).
  for (int l = 0; l < 2; ++l) {
    const KvPageLayout& pl = f[l].layout();
    const int64_t used = l == 0 ? pl.v.meta_offset + int64_t{pr.kvh} * pr.bs * pl.v.meta_bytes
                                : pl.cross.index_offset + pr.bs;
    if (l == 0) {
      REQUIRE(std::memcmp(c.pages->block(0, id), direct.block(0, 0), used) == 0);
    } else {
      REQUIRE(std::memcmp(c.pages->block(1, id) + pl.cross.ratio_offset,
                          direct.block(1, 0) + pl.cross.ratio_offset,
                          used - pl.cross.ratio_offset) == 0);
    }
  }
  std::vector<float> a(4 * pr.bs * width), b(4 * pr.bs * width);
  auto rebuild = [&](const uint8_t* b0, const uint8_t* b1, std::vector<float>& x) {
    const size_t n = pr.bs * width;
    ReconstructCrossLayerBlock(f[0].layout(), f[1].layout(), b0, b1, x.data(), x.data() + n,
                               x.data() + 2 * n, x.data() + 3 * n);
  };
  rebuild(c.pages->block(0, id), c.pages->block(1, id), a);
  rebuild(direct.block(0, 0), direct.block(1, 0), b);
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace kvserve::cpu
