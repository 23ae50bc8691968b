#include "kernels/cpu/attention/paged_attention.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "tests/kernels/attention_problem.h"

namespace kvserve::cpu {
namespace {

using testing::AttnCase;
using testing::Build;
using testing::Problem;

// The problems these tests sweep start from small heads and int4 groups of 32.
AttnCase SmallCase() {
  AttnCase c;
  c.head_dim = 8;
  c.int4_group = 32;
  return c;
}

std::vector<float> Run(const Problem& p, const HostKvPages& pages, int window, CpuIsa isa) {
  std::vector<float> out(p.q.size(), -777.0f);
  PagedAttentionParams a;
  a.q = p.q.data();
  a.out = out.data();
  a.kv = LayerView(pages, 0);
  a.batch = ViewOf(p.batch);
  a.num_heads = p.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(pages.format().head_dim()));
  a.sliding_window = window;
  a.isa = isa;
  // Two calls over a split row range, as a thread pool would make them.
  const int32_t t = p.batch.num_tokens(), mid = t / 2;
  PagedAttention(a, 0, mid);
  PagedAttention(a, mid, t);
  return out;
}

// Dequantized row (head h, cache index i of sequence s) read back from pages.
void ReadRow(const Problem& p, const KvPartLayout& part, int s, int i, int h, float* out) {
  const KvFormat& f = p.format;
  const int bs = f.block_size();
  const uint8_t* block = p.pages.layer(0) + int64_t(p.batch.BlockRow(s)[i / bs]) * f.block_bytes();
  DequantizeRow(part, f.head_dim(), block + f.RowOffset(part, h, i % bs),
                block + f.MetaOffset(part, h, i % bs), out);
}

// A copy of the cache in fp32 holding exactly the dequantized values.
HostKvPages Fp32Copy(const Problem& p) {
  const KvFormat& f = p.format;
  KvFormat f32 = *KvFormat::Create(KvDtype::kFp32, f.num_kv_heads(), f.head_dim(), f.block_size());
  HostKvPages copy(f32, 1, p.pages.num_blocks());
  std::memset(copy.layer(0), 0xff, copy.total_bytes());
  for (int s = 0; s < p.batch.num_seqs(); ++s) {
    for (int i = 0; i < p.batch.context_len[s]; ++i) {
      const int bs = f.block_size();
      uint8_t* block = copy.layer(0) + int64_t(p.batch.BlockRow(s)[i / bs]) * f32.block_bytes();
      for (int h = 0; h < f.num_kv_heads(); ++h) {
        ReadRow(p, f.k(), s, i, h,
                reinterpret_cast<float*>(block + f32.RowOffset(f32.k(), h, i % bs)));
        ReadRow(p, f.v(), s, i, h,
                reinterpret_cast<float*>(block + f32.RowOffset(f32.v(), h, i % bs)));
      }
    }
  }
  return copy;
}

// Naive softmax attention in double over the dequantized rows, plus the
// largest |v| each (row, head) could mix (the scale of its error) and,
// when asked, the largest |score| of any row.
void Reference(const Problem& p, int window, std::vector<double>* out, std::vector<double>* vmax,
               double* max_abs_score = nullptr) {
  const KvFormat& f = p.format;
  const int hd = f.head_dim(), nh = p.num_heads, group = nh / f.num_kv_heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  out->assign(p.q.size(), 0.0);
  vmax->assign(p.q.size() / hd, 0.0);
  std::vector<float> k(hd), v(hd);
  for (int s = 0; s < p.batch.num_seqs(); ++s) {
    const int q_len = p.batch.query_start[s + 1] - p.batch.query_start[s];
    for (int r = p.batch.query_start[s]; r < p.batch.query_start[s + 1]; ++r) {
      const int idx = p.batch.context_len[s] - q_len + (r - p.batch.query_start[s]);
      const int lo = window > 0 ? std::max(0, idx - window + 1) : 0;
      for (int h = 0; h < nh; ++h) {
        const float* q = p.q.data() + (int64_t(r) * nh + h) * hd;
        std::vector<double> sc;
        for (int i = lo; i <= idx; ++i) {
          ReadRow(p, f.k(), s, i, h / group, k.data());
          double d = 0.0;
          for (int j = 0; j < hd; ++j) d += double(q[j]) * k[j];
          sc.push_back(d * scale);
          if (max_abs_score != nullptr) {
            *max_abs_score = std::max(*max_abs_score, std::fabs(sc.back()));
          }
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double sum = 0.0;
        for (double& x : sc) sum += (x = std::exp(x - m));
        double* o = out->data() + (int64_t(r) * nh + h) * hd;
        double& vm = (*vmax)[int64_t(r) * nh + h];
        for (int i = lo; i <= idx; ++i) {
          ReadRow(p, f.v(), s, i, h / group, v.data());
          for (int j = 0; j < hd; ++j) {
            o[j] += sc[i - lo] / sum * v[j];
            vm = std::max(vm, std::fabs(double(v[j])));
          }
        }
      }
    }
  }
}

// max over (row, head) of max|a - b| / max|v|.
double WorstRelErr(const std::vector<float>& a, const std::vector<double>& b,
                   const std::vector<double>& vmax, int hd) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - b[i]) / std::max(vmax[i / hd], 1e-30);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

std::vector<double> ToDouble(const std::vector<float>& x) { return {x.begin(), x.end()}; }

std::vector<CpuIsa> Paths() {
  if (CpuHasAvx2()) return {CpuIsa::kScalar, CpuIsa::kAvx2};
  WARN("no AVX2 on this CPU: testing the scalar path only");
  return {CpuIsa::kScalar};
}

bool AllFinite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

// Checks every path against the double reference and against the fp32
// kernel over an fp32 copy of the dequantized cache, and the paths against
// each other, to `tol` of max|v|. *max_abs_score (if asked): the largest
// |score| the case holds.
void CheckCase(const AttnCase& c, double tol = 1e-5, double* max_abs_score = nullptr) {
  INFO(c.Name());
  const Problem p = Build(c);
  std::vector<double> ref, vmax;
  Reference(p, c.window, &ref, &vmax, max_abs_score);
  const HostKvPages copy = Fp32Copy(p);
  const int hd = c.head_dim;
  std::vector<std::vector<float>> outs;
  for (CpuIsa isa : Paths()) {
    INFO("path " << CpuIsaName(isa));
    const std::vector<float> got = Run(p, p.pages, c.window, isa);
    const std::vector<float> via_copy = Run(p, copy, c.window, isa);
    CHECK(AllFinite(got));
    CHECK(WorstRelErr(got, ref, vmax, hd) <= tol);
    CHECK(WorstRelErr(got, ToDouble(via_copy), vmax, hd) <= tol);
    outs.push_back(got);
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    CHECK(WorstRelErr(outs[i], ToDouble(outs[0]), vmax, hd) <= tol);
  }
}

TEST_CASE("paged attention over every format matches attention over its dequantized values",
          "[kernels][attention]") {
  // Each batch mixes a decode row, a 5-row prefill chunk at the end of the
  // same context and a whole prompt prefill, all sharing the pool.
  for (KvDtype dtype : kAllKvDtypes) {
    SECTION(std::string(KvDtypeName(dtype))) {
      uint32_t seed = 1;
      for (int bs : {1, 16, 64}) {
        for (int ctx : {1, 17, 97}) {
          for (int hd : {8, 64, 128}) {
            for (int group : {1, 2, 4}) {
              for (int window : {0, 7}) {
                AttnCase c = SmallCase();
                c.dtype = dtype;
                c.block_size = bs;
                c.head_dim = hd;
                c.group = group;
                c.window = window;
                c.ctx = {ctx, ctx, std::min(ctx, 17)};
                c.q_len = {1, std::min(ctx, 5), std::min(ctx, 17)};
                c.seed = seed++;
                CheckCase(c);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("long contexts merge softmax tiles exactly", "[kernels][attention]") {
  // 700 keys in blocks of 16 make 88 chunks, so three tiles whose maxima
  // differ; scaled-up queries make the softmax peaky so a wrong rescale shows.
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kInt8, KvDtype::kK8V4}) {
    for (int hd : {8, 64}) {
      AttnCase c = SmallCase();
      c.dtype = dtype;
      c.head_dim = hd;
      c.group = 2;
      c.ctx = {700, 300};
      c.q_len = {1, 3};
      c.q_scale = 6.0f;
      c.seed = 77 + hd;
      CheckCase(c);
      c.window = 333;
      CheckCase(c);
    }
  }
}

TEST_CASE("GQA groups that are not powers of two and MQA", "[kernels][attention]") {
  for (int group : {3, 8, 6}) {
    for (int hkv : {1, 2}) {
      AttnCase c = SmallCase();
      c.dtype = group == 3 ? KvDtype::kFp16 : KvDtype::kInt4;
      c.head_dim = 64;
      c.num_kv_heads = hkv;
      c.group = group;
      c.ctx = {45};
      c.q_len = {4};
      CheckCase(c);
    }
  }
}

TEST_CASE("shapes outside the AVX2 kernels fall back to the scalar path", "[kernels][attention]") {
  SECTION("head_dim 6 (not a multiple of 8)") {
    for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kBf16, KvDtype::kInt8}) {
      AttnCase c = SmallCase();
      c.dtype = dtype;
      c.head_dim = 6;
      c.group = 2;
      c.ctx = {19, 3};
      c.q_len = {19, 1};
      CheckCase(c);
    }
  }
  SECTION("int4 groups of 4 channels") {
    AttnCase c = SmallCase();
    c.dtype = KvDtype::kK8V4;
    c.head_dim = 16;
    c.int4_group = 4;
    c.ctx = {19, 3};
    c.q_len = {19, 1};
    CheckCase(c);
  }
}

TEST_CASE("the instruction set is resolved once, and KVSERVE_CPU_ISA can force scalar",
          "[kernels][attention]") {
  const CpuIsa def = DefaultCpuIsa();
  REQUIRE(def != CpuIsa::kAuto);
  REQUIRE(ResolveCpuIsa(CpuIsa::kAuto) == def);
  REQUIRE(ResolveCpuIsa(CpuIsa::kScalar) == CpuIsa::kScalar);
  REQUIRE(ResolveCpuIsa(CpuIsa::kAvx2) == (CpuHasAvx2() ? CpuIsa::kAvx2 : CpuIsa::kScalar));
  const char* env = std::getenv("KVSERVE_CPU_ISA");
  if (env != nullptr && std::string(env) == "scalar") {
    REQUIRE(def == CpuIsa::kScalar);
  } else {
    REQUIRE(def == (CpuHasAvx2() ? CpuIsa::kAvx2 : CpuIsa::kScalar));
  }
}

TEST_CASE("WriteKv skips rows with a negative slot", "[kernels][attention]") {
  KvFormat f = *KvFormat::Create(KvDtype::kInt8, 1, 8, 4);
  HostKvPages pages(f, 1, 2);
  std::vector<float> k(16, 1.0f), v(16, 2.0f);
  const int64_t slots[2] = {-1, 5};
  KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.slot_mapping = slots;
  w.num_tokens = 2;
  w.kv = LayerView(pages, 0);
  WriteKv(w);
  std::vector<float> row(8);
  const uint8_t* block1 = pages.block(0, 1);
  DequantizeRow(f.v(), 8, block1 + f.RowOffset(f.v(), 0, 1), block1 + f.MetaOffset(f.v(), 0, 1),
                row.data());
  REQUIRE(row == std::vector<float>(8, 2.0f));
  // Block 0 was never written: still all zero bytes.
  const uint8_t* block0 = pages.block(0, 0);
  REQUIRE(std::all_of(block0, block0 + f.block_bytes(), [](uint8_t x) { return x == 0; }));
}

// ---- Eviction extras: sink queries and per-key attention mass -------------

struct EvictionRun {
  std::vector<float> out;
  std::vector<float> mass;  // [sum over recorded rows of their keys]
};

// Runs with sink_q for keys below sinks[s] and, when record, key mass for
// every other row (odd rows are not recorded: their part stays poisoned).
EvictionRun RunEviction(const Problem& p, const std::vector<float>& sink_q,
                        const std::vector<int32_t>& sinks, bool record,
                        std::vector<int64_t>* offsets, CpuIsa isa) {
  EvictionRun r;
  r.out.assign(p.q.size(), -777.0f);
  const BatchView bv = ViewOf(p.batch);
  offsets->assign(p.batch.num_tokens(), -1);
  int64_t total = 0;
  for (int32_t t = 0; t < p.batch.num_tokens(); t += 2) {
    (*offsets)[t] = total;
    total += bv.CacheIndex(bv.SeqOfRow(t), t) + 1;
  }
  r.mass.assign(total, -5.0f);
  PagedAttentionParams a;
  a.q = p.q.data();
  a.out = r.out.data();
  a.kv = LayerView(p.pages, 0);
  a.batch = bv;
  a.num_heads = p.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.format.head_dim()));
  a.isa = isa;
  if (!sinks.empty()) {
    a.sink_q = sink_q.data();
    a.num_sinks = sinks.data();
  }
  if (record) {
    a.key_mass = r.mass.data();
    a.key_mass_offset = offsets->data();
  }
  const int32_t t = p.batch.num_tokens(), mid = t / 2;
  PagedAttention(a, 0, mid);
  PagedAttention(a, mid, t);
  return r;
}

// Double reference with the sink query for keys below sinks[s]: outputs and
// per-key mass summed over heads ([T][keys], keys of row t from 0).
void EvictionReference(const Problem& p, const std::vector<float>& sink_q,
                       const std::vector<int32_t>& sinks, std::vector<double>* out,
                       std::vector<double>* vmax, std::vector<std::vector<double>>* mass) {
  const KvFormat& f = p.format;
  const int hd = f.head_dim(), nh = p.num_heads, group = nh / f.num_kv_heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  out->assign(p.q.size(), 0.0);
  vmax->assign(p.q.size() / hd, 0.0);
  mass->assign(p.batch.num_tokens(), {});
  std::vector<float> k(hd), v(hd);
  for (int s = 0; s < p.batch.num_seqs(); ++s) {
    const int q_len = p.batch.query_start[s + 1] - p.batch.query_start[s];
    for (int r = p.batch.query_start[s]; r < p.batch.query_start[s + 1]; ++r) {
      const int idx = p.batch.context_len[s] - q_len + (r - p.batch.query_start[s]);
      (*mass)[r].assign(idx + 1, 0.0);
      for (int h = 0; h < nh; ++h) {
        std::vector<double> sc;
        for (int i = 0; i <= idx; ++i) {
          const float* q = (i < sinks[s] ? sink_q : p.q).data() + (int64_t(r) * nh + h) * hd;
          ReadRow(p, f.k(), s, i, h / group, k.data());
          double d = 0.0;
          for (int j = 0; j < hd; ++j) d += double(q[j]) * k[j];
          sc.push_back(d * scale);
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double sum = 0.0;
        for (double& x : sc) sum += (x = std::exp(x - m));
        double* o = out->data() + (int64_t(r) * nh + h) * hd;
        double& vm = (*vmax)[int64_t(r) * nh + h];
        for (int i = 0; i <= idx; ++i) {
          (*mass)[r][i] += sc[i] / sum;
          ReadRow(p, f.v(), s, i, h / group, v.data());
          for (int j = 0; j < hd; ++j) {
            o[j] += sc[i] / sum * v[j];
            vm = std::max(vm, std::fabs(double(v[j])));
          }
        }
      }
    }
  }
}

// Checks every path with sink queries drawn from N(0, sink_sigma) for keys
// below sinks[s], recording key mass for every other row, against the
// double reference: outputs to `tol` of max|v|, every recorded row's mass
// summing to its heads and each key's to 2e-5 per head.
void CheckEvictionCase(const AttnCase& c, float sink_sigma, const std::vector<int32_t>& sinks,
                       double tol) {
  INFO(c.Name());
  const Problem p = Build(c);
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, sink_sigma);
  std::vector<float> sink_q(p.q.size());
  for (float& x : sink_q) x = normal(rng);
  std::vector<double> ref, vmax;
  std::vector<std::vector<double>> ref_mass;
  EvictionReference(p, sink_q, sinks, &ref, &vmax, &ref_mass);
  for (CpuIsa isa : Paths()) {
    INFO("path " << CpuIsaName(isa));
    std::vector<int64_t> offsets;
    const EvictionRun plain = RunEviction(p, sink_q, sinks, false, &offsets, isa);
    const EvictionRun rec = RunEviction(p, sink_q, sinks, true, &offsets, isa);
    CHECK(AllFinite(rec.out));
    CHECK(WorstRelErr(rec.out, ref, vmax, c.head_dim) <= tol);
    // Recording changes nothing in the output.
    REQUIRE(std::memcmp(plain.out.data(), rec.out.data(), plain.out.size() * sizeof(float)) == 0);
    double worst = 0.0;
    for (int32_t t = 0; t < p.batch.num_tokens(); ++t) {
      if (offsets[t] < 0) continue;
      double total = 0.0;
      for (size_t j = 0; j < ref_mass[t].size(); ++j) {
        const double got = rec.mass[offsets[t] + j];
        worst = std::isnan(got) ? INFINITY : std::max(worst, std::fabs(got - ref_mass[t][j]));
        total += got;
      }
      CHECK(total == Approx(p.num_heads).epsilon(1e-5));
    }
    CHECK(worst <= 2e-5 * p.num_heads);
  }
}

TEST_CASE("sink queries and key mass match the reference on every path",
          "[kernels][attention][eviction]") {
  uint32_t seed = 500;
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kInt8, KvDtype::kInt4, KvDtype::kFp16}) {
    for (int hd : {8, 64}) {
      for (int group : {1, 4}) {
        for (int bs : {4, 16}) {
          AttnCase c = SmallCase();
          c.dtype = dtype;
          c.head_dim = hd;
          c.group = group;
          c.block_size = bs;
          c.int4_group = 8;
          // Decode rows, a chunk, and a long row that needs several tiles.
          c.ctx = {23, 40, 300, 6};
          c.q_len = {1, 6, 1, 6};
          c.q_scale = 3.0f;
          c.seed = seed++;
          CheckEvictionCase(c, 3.0f, {4, 0, 21, 9}, 1e-5);  // 9 > a 6-entry context
        }
      }
    }
  }
}

TEST_CASE("rows without a mass offset leave the buffer alone", "[kernels][attention][eviction]") {
  AttnCase c = SmallCase();
  c.ctx = {10, 12};
  c.q_len = {2, 3};
  const Problem p = Build(c);
  for (CpuIsa isa : Paths()) {
    std::vector<int64_t> offsets;
    const EvictionRun rec = RunEviction(p, {}, {}, true, &offsets, isa);
    // Rows 0, 2 and 4 are recorded (9, 10 and 12 keys), every key of each.
    REQUIRE(rec.mass.size() == 9 + 11 + 11);
    REQUIRE(std::none_of(rec.mass.begin(), rec.mass.end(), [](float x) { return x == -5.0f; }));
  }
}

// exp overflows fp32 above about 88.7 and underflows below about -103, so
// the softmax must subtract each row's maximum (or a running one, merging
// tiles) before exponentiating. Queries scaled by 100 give scores of a few
// hundred either way; the double reference needs no such care.
TEST_CASE("scores far past the fp32 range of exp stay finite and match the double reference",
          "[kernels][attention]") {
  uint32_t seed = 900;
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kK8V4}) {
    for (int hd : {8, 64}) {
      AttnCase c = SmallCase();
      c.dtype = dtype;
      c.head_dim = hd;
      c.group = 2;
      c.int4_group = 8;
      // A lone key, a chunk, and a row over two AVX2 tiles.
      c.ctx = {1, 40, 300};
      c.q_len = {1, 5, 1};
      c.q_scale = 100.0f;
      c.seed = seed++;
      SECTION(c.Name()) {
        double max_abs_score = 0.0;
        CheckCase(c, 1e-5, &max_abs_score);
        REQUIRE(max_abs_score > 200.0);
        CheckEvictionCase(c, 100.0f, {4, 0, 21}, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
