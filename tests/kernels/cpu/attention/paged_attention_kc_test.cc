// Attention over int4_kc and int2_kc pages, played step by step as the engine does:
// FlushKvBlocks, PagedAttention, WriteKvTails per step, with sequences cut
// into prefill chunks and decode rows of every size, partial tails, block
// sizes 16/32/64 and odd lengths, over a shuffled pool whose unused bytes
// (blocks and tails) are NaN-poisoned. Every row must equal attention in
// double over an fp32 copy of what it should see (earlier blocks as
// dequantized from the pages, its own block in full precision) to 1e-5 of
// max|v|, on both paths; and a row must see exactly the same thing however
// its sequence was cut into steps.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {
namespace {

struct KcCase {
  KvDtype dtype = KvDtype::kInt4Kc;  // or kInt2Kc
  int block_size = 16;
  int head_dim = 8;
  int num_kv_heads = 2;
  int group = 2;
  int window = 0;
  KvElem tail = KvElem::kFp32;
  // Per sequence, the rows of each of its steps (their sum is its length).
  std::vector<std::vector<int>> chunks;
  float q_scale = 1.0f;  // > 1 makes the scores large and the softmax peaky
  uint32_t seed = 1;

  std::string Name() const {
    std::string s = absl::StrCat(std::string(KvDtypeName(dtype)), " bs", block_size, " hd",
                                 head_dim, " kv", num_kv_heads, " g", group, " w", window,
                                 tail == KvElem::kFp32 ? " fp32 tails" : " fp16 tails", " qs",
                                 q_scale, " seqs");
    for (const auto& c : chunks) {
      absl::StrAppend(&s, " [");
      for (int n : c) absl::StrAppend(&s, n, ",");
      absl::StrAppend(&s, "]");
    }
    return s;
  }
};

std::vector<CpuIsa> Paths() {
  if (CpuHasAvx2()) return {CpuIsa::kScalar, CpuIsa::kAvx2};
  WARN("no AVX2 on this CPU: testing the scalar path only");
  return {CpuIsa::kScalar};
}

// What one run produced: every row's output per path, keyed by (sequence,
// index), and the final pages.
struct RunResult {
  std::map<std::tuple<int, int, int>, std::vector<float>> out;  // (path, seq, index)
  std::vector<uint8_t> blocks;                                  // the layer's blocks
  double worst = 0;
  double max_abs_score = 0;  // of the reference, over every row
  int rows = 0;
};

class KcRun {
 public:
  explicit KcRun(const KcCase& c)
      : c_(c),
        format_(*KvFormat::Create(c.dtype, c.num_kv_heads, c.head_dim, c.block_size, 64, c.tail)),
        rng_(c.seed) {
    const int ns = static_cast<int>(c.chunks.size());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int total_blocks = 3, max_blocks = 1;
    for (const auto& ch : c.chunks) {
      len_.push_back(std::accumulate(ch.begin(), ch.end(), 0));
      const int n = (len_.back() + c.block_size - 1) / c.block_size;
      total_blocks += n;
      max_blocks = std::max(max_blocks, n);
    }
    // Values depend on the sequence only (the seed), never on the chunking.
    const int hd = c.head_dim, hkv = c.num_kv_heads, nh = hkv * c.group;
    std::mt19937 vrng(c.seed * 7919u);
    for (int s = 0; s < ns; ++s) {
      const float phase = normal(vrng);
      std::vector<float> k(static_cast<size_t>(len_[s]) * hkv * hd), v(k.size()),
          q(static_cast<size_t>(len_[s]) * nh * hd);
      for (int i = 0; i < len_[s]; ++i) {
        for (int h = 0; h < hkv; ++h) {
          float* kr = k.data() + (static_cast<size_t>(i) * hkv + h) * hd;
          float* vr = v.data() + (static_cast<size_t>(i) * hkv + h) * hd;
          for (int d = 0; d < hd; ++d) {
            kr[d] = normal(vrng);
            vr[d] = normal(vrng) + (d % 3 == 0 ? 1.5f : 0.0f);
          }
          // A slowly rotating outlier pair, as RoPE leaves some keys.
          kr[hd - 2] = 8.0f * std::cos(phase + 0.02f * i);
          kr[hd - 1] = 8.0f * std::sin(phase + 0.02f * i) + 3.0f;
        }
      }
      for (float& x : q) x = c.q_scale * normal(vrng);
      k_.push_back(std::move(k));
      v_.push_back(std::move(v));
      q_.push_back(std::move(q));
    }
    pages_ = std::make_unique<HostKvPages>(std::vector<KvFormat>{format_}, total_blocks, ns + 2);
    std::memset(pages_->layer(0), 0xff, pages_->total_bytes());  // NaN everywhere unwritten
    std::vector<int32_t> ids(total_blocks), tails(ns + 2);
    std::iota(ids.begin(), ids.end(), 0);
    std::iota(tails.begin(), tails.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    std::shuffle(tails.begin(), tails.end(), rng_);
    max_blocks_ = max_blocks;
    table_.assign(static_cast<size_t>(ns) * max_blocks, -1);
    int next = 0;
    for (int s = 0; s < ns; ++s) {
      for (int i = 0; i < (len_[s] + c.block_size - 1) / c.block_size; ++i) {
        table_[s * max_blocks + i] = ids[next++];
      }
      tail_.push_back(tails[s]);
    }
  }

  RunResult Run() {
    RunResult res;
    const int ns = static_cast<int>(c_.chunks.size());
    std::vector<int> done(ns, 0);
    for (size_t step = 0;; ++step) {
      std::vector<int> seqs;
      for (int s = 0; s < ns; ++s) {
        if (step < c_.chunks[s].size()) seqs.push_back(s);
      }
      if (seqs.empty()) break;
      Step(seqs, step, done, &res);
    }
    res.blocks.assign(pages_->layer(0),
                      pages_->layer(0) + format_.block_bytes() * pages_->num_blocks());
    return res;
  }

 private:
  // The value of K (v = false) or V, head h, index i of sequence s, as the
  // row's own block holds it (fp16 tails round).
  float Own(bool v, int s, int i, int h, int d) const {
    const float x =
        (v ? v_ : k_)[s][(static_cast<size_t>(i) * c_.num_kv_heads + h) * c_.head_dim + d];
    return c_.tail == KvElem::kFp32 ? x : Fp16ToFloat(FloatToFp16(x));
  }

  // Dequantized row of an earlier (full, flushed) block, read from the pages.
  void Paged(bool v, int s, int i, int h, float* out) const {
    const KvPageLayout& f = format_.layout();
    const int bs = c_.block_size;
    const uint8_t* block = pages_->block(0, table_[s * max_blocks_ + i / bs]);
    const KvPartLayout& part = v ? f.v : f.k;
    const int64_t meta = v ? f.MetaOffset(f.v, h, i % bs) : f.BlockMetaOffset(f.k, h);
    DequantizeRow(part, c_.head_dim, block + f.RowOffset(part, h, i % bs), block + meta, out);
  }

  void Step(const std::vector<int>& seqs, size_t step, std::vector<int>& done, RunResult* res) {
    const int hd = c_.head_dim, hkv = c_.num_kv_heads, nh = hkv * c_.group, bs = c_.block_size;
    BatchInput b;
    b.Clear();
    b.max_blocks_per_seq = max_blocks_;
    std::vector<float> k, v, q;
    std::vector<std::pair<int, int>> rows;  // (seq, index)
    for (int s : seqs) {
      const int n = c_.chunks[s][step];
      for (int i = done[s]; i < done[s] + n; ++i) {
        b.token_ids.push_back(0);
        b.positions.push_back(i);
        b.slot_mapping.push_back(-1);  // int4_kc does not read it
        rows.emplace_back(s, i);
        const size_t kv_off = static_cast<size_t>(i) * hkv * hd;
        k.insert(k.end(), k_[s].begin() + kv_off, k_[s].begin() + kv_off + hkv * hd);
        v.insert(v.end(), v_[s].begin() + kv_off, v_[s].begin() + kv_off + hkv * hd);
        const size_t q_off = static_cast<size_t>(i) * nh * hd;
        q.insert(q.end(), q_[s].begin() + q_off, q_[s].begin() + q_off + nh * hd);
      }
      b.query_start.push_back(b.query_start.back() + n);
      b.context_len.push_back(done[s] + n);
      b.block_table.insert(b.block_table.end(), table_.begin() + s * max_blocks_,
                           table_.begin() + (s + 1) * max_blocks_);
      b.tail_ids.push_back(tail_[s]);
    }
    const BatchView view = ViewOf(b);
    KvBlockWriteParams w;
    w.k = k.data();
    w.v = v.data();
    w.batch = view;
    w.kv = LayerView(*pages_, 0);
    // Two calls over split ranges, as the thread pool makes them.
    const int32_t B = b.num_seqs(), T = b.num_tokens();
    FlushKvBlocks(w, 0, B / 2);
    FlushKvBlocks(w, B / 2, B);

    // The reference, in double.
    std::vector<double> ref(q.size(), 0.0), vmax(static_cast<size_t>(T) * nh, 0.0);
    std::vector<float> row(hd);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int32_t r = 0; r < T; ++r) {
      const auto [s, idx] = rows[r];
      const int lo = c_.window > 0 ? std::max(0, idx - c_.window + 1) : 0;
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / c_.group;
        auto key = [&](bool is_v, int j) {
          if (j / bs < idx / bs) {
            Paged(is_v, s, j, kvh, row.data());
          } else {
            for (int d = 0; d < hd; ++d) row[d] = Own(is_v, s, j, kvh, d);
          }
        };
        std::vector<double> sc;
        const float* qr = q.data() + (static_cast<size_t>(r) * nh + h) * hd;
        for (int j = lo; j <= idx; ++j) {
          key(false, j);
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(qr[d]) * row[d];
          sc.push_back(dot * scale);
          res->max_abs_score = std::max(res->max_abs_score, std::fabs(sc.back()));
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - m));
        for (int j = lo; j <= idx; ++j) {
          key(true, j);
          for (int d = 0; d < hd; ++d) {
            ref[(static_cast<size_t>(r) * nh + h) * hd + d] += sc[j - lo] / sum * row[d];
            vmax[static_cast<size_t>(r) * nh + h] =
                std::max(vmax[static_cast<size_t>(r) * nh + h], std::fabs(double(row[d])));
          }
        }
      }
    }

    const std::vector<CpuIsa> paths = Paths();
    for (size_t pi = 0; pi < paths.size(); ++pi) {
      INFO("path " << CpuIsaName(paths[pi]) << ", step " << step);
      std::vector<float> out(q.size(), -777.0f);
      PagedAttentionParams a;
      a.q = q.data();
      a.out = out.data();
      a.kv = LayerView(*pages_, 0);
      a.batch = view;
      a.num_heads = nh;
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      a.sliding_window = c_.window;
      a.isa = paths[pi];
      a.new_k = k.data();
      a.new_v = v.data();
      PagedAttention(a, 0, T / 3);
      PagedAttention(a, T / 3, T);
      for (size_t i = 0; i < out.size(); ++i) {
        const double e = std::fabs(double(out[i]) - ref[i]) / std::max(vmax[i / hd], 1e-30);
        res->worst = std::isnan(e) ? INFINITY : std::max(res->worst, e);
      }
      for (int32_t r = 0; r < T; ++r) {
        const auto [s, idx] = rows[r];
        res->out[{static_cast<int>(pi), s, idx}] =
            std::vector<float>(out.begin() + static_cast<size_t>(r) * nh * hd,
                               out.begin() + static_cast<size_t>(r + 1) * nh * hd);
      }
    }
    res->rows += T;
    WriteKvTails(w, 0, T / 2);
    WriteKvTails(w, T / 2, T);
    for (int s : seqs) done[s] += c_.chunks[s][step];
  }

  KcCase c_;
  KvFormat format_;
  std::mt19937 rng_;
  std::vector<int> len_;
  std::vector<std::vector<float>> k_, v_, q_;  // per sequence
  std::unique_ptr<HostKvPages> pages_;
  int max_blocks_ = 1;
  std::vector<int32_t> table_;
  std::vector<int32_t> tail_;
};

// Steps of `len` rows: a first chunk, then pieces cycling through `sizes`.
std::vector<int> Cut(int len, int first, std::vector<int> sizes) {
  std::vector<int> out;
  int done = std::min(first, len);
  out.push_back(done);
  for (size_t i = 0; done < len; ++i) {
    const int n = std::min(sizes[i % sizes.size()], len - done);
    out.push_back(n);
    done += n;
  }
  return out;
}

TEST_CASE(
    "int4_kc and int2_kc attention equal attention over the dequantized blocks and its own block",
    "[kernels][attention]") {
  uint32_t seed = 1;
  for (KvDtype dtype : {KvDtype::kInt4Kc, KvDtype::kInt2Kc})
    for (int bs : {16, 32, 64}) {
      for (int hd : {8, 64, 128}) {
        for (int window : {0, 7, 40}) {
          KcCase c;
          c.dtype = dtype;
          c.block_size = bs;
          c.head_dim = hd;
          c.group = hd == 64 ? 3 : 2;
          c.window = window;
          c.seed = seed++;
          // A whole odd prompt, a prompt then decode rows, odd chunks, a short
          // sequence, one that fills exactly two blocks.
          c.chunks = {{97},
                      Cut(81, 5, {1}),
                      Cut(bs * 2 + 7, 3, {7, 13, 1, bs + 1}),
                      {1, 1, 1},
                      Cut(2 * bs, bs - 1, {1})};
          INFO(c.Name());
          const RunResult r = KcRun(c).Run();
          CHECK(r.worst <= 1e-5);
        }
      }
    }
}

TEST_CASE("an int4_kc or int2_kc row sees the same keys however its sequence was cut into steps",
          "[kernels][attention]") {
  for (KvDtype dtype : {KvDtype::kInt4Kc, KvDtype::kInt2Kc})
    for (KvElem tail : {KvElem::kFp32, KvElem::kFp16}) {
      for (int bs : {16, 32}) {
        KcCase a;
        a.dtype = dtype;
        a.block_size = bs;
        a.head_dim = 64;
        a.tail = tail;
        a.seed = 40 + bs;
        a.chunks = {{150}, {3 * bs + 5}, Cut(70, 1, {1})};
        KcCase b = a;
        b.chunks = {Cut(150, 7, {bs - 1, 1, 2 * bs + 3}), Cut(3 * bs + 5, bs, {1}),
                    Cut(70, 33, {5, 1})};
        INFO(a.Name() << " vs " << b.Name());
        const RunResult ra = KcRun(a).Run();
        const RunResult rb = KcRun(b).Run();
        CHECK(ra.worst <= 1e-5);
        CHECK(rb.worst <= 1e-5);
        REQUIRE(ra.rows == 150 + 3 * bs + 5 + 70);
        REQUIRE(rb.rows == ra.rows);
        // Every full block holds the same bytes, and every row the same output.
        REQUIRE(ra.blocks.size() == rb.blocks.size());
        REQUIRE(ra.blocks == rb.blocks);
        REQUIRE(ra.out.size() == rb.out.size());
        for (const auto& [key, out] : ra.out) {
          INFO("path " << std::get<0>(key) << " seq " << std::get<1>(key) << " index "
                       << std::get<2>(key));
          REQUIRE(rb.out.at(key) == out);
        }
      }
    }
}

TEST_CASE("int4_kc and int2_kc shapes outside the AVX2 kernel fall back to the scalar path",
          "[kernels][attention]") {
  for (KvDtype dtype : {KvDtype::kInt4Kc, KvDtype::kInt2Kc}) {
    KcCase c;
    c.dtype = dtype;
    c.head_dim = dtype == KvDtype::kInt4Kc ? 6 : 12;  // int2_kc packs four codes a byte
    c.num_kv_heads = 1;
    c.group = 4;
    c.chunks = {Cut(40, 17, {1, 3})};
    INFO(c.Name());
    const RunResult r = KcRun(c).Run();
    CHECK(r.worst <= 1e-5);
  }
}

TEST_CASE(
    "int4_kc and int2_kc scores far past the fp32 range of exp stay finite and match the reference",
    "[kernels][attention]") {
  // Queries scaled by 100 against the keys' outlier pair give scores of
  // several hundred, up to about 1500 (exp overflows fp32 above about
  // 88.7). fp32 rounds a score of 1500 by up to 1500 * 2^-24 = 9e-5, which
  // moves its weight by as much relative to itself: hence 1e-4 rather than
  // 1e-5 (2e-5 is what the paths reach).
  for (KvDtype dtype : {KvDtype::kInt4Kc, KvDtype::kInt2Kc})
    for (int hd : {8, 64}) {
      KcCase c;
      c.dtype = dtype;
      c.head_dim = hd;
      c.q_scale = 100.0f;
      c.seed = 60 + hd;
      c.chunks = {{40}, Cut(300, 17, {1, 5}), {1}};
      INFO(c.Name());
      const RunResult r = KcRun(c).Run();
      REQUIRE(r.max_abs_score > 200.0);
      CHECK(r.worst <= 1e-4);
      for (const auto& [key, out] : r.out) {
        INFO("path " << std::get<0>(key) << " seq " << std::get<1>(key) << " index "
                     << std::get<2>(key));
        REQUIRE(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
      }
    }
}

}  // namespace
}  // namespace kvserve::cpu
