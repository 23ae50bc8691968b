// Attention problems shared by the CPU kernel tests, the [gpu] tests and the
// simulated-kernel tests: a batch of sequences over a shuffled, NaN-poisoned
// page pool written by cpu::WriteKv (so any read outside a row's keys shows
// up in its output), q drawn from values exact in fp32, fp16 and bf16, the
// CPU reference run (cpu::PagedAttention); and, for the device tests, the
// error measure with its tolerances (see
// tests/kernels/cuda/attention/paged_attention_test.cc for the justification).
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/paged_view.h"
#include "kernels/plan/attention_plan.h"

namespace kvserve::testing {

// One attention problem: sequences of context ctx[s] whose last q_len[s]
// cache entries are this step's rows (q_len 1: decode; q_len == ctx: a whole
// prompt; in between: a chunk after a prefix-cache hit).
struct AttnCase {
  KvDtype dtype = KvDtype::kFp32;
  int block_size = 16;
  int head_dim = 64;
  int num_kv_heads = 2;
  int group = 1;
  int window = 0;
  int int4_group = 64;
  std::vector<int> ctx;
  std::vector<int> q_len;
  float q_scale = 1.0f;  // > 1 makes the softmax peaky
  uint32_t seed = 1;

  std::string Name() const {
    std::string s = absl::StrCat(std::string(KvDtypeName(dtype)), " bs", block_size, " hd",
                                 head_dim, " kv", num_kv_heads, " g", group, " w", window, " int4g",
                                 int4_group, " qs", q_scale, " seqs");
    for (size_t i = 0; i < ctx.size(); ++i) absl::StrAppend(&s, " ", ctx[i], "/", q_len[i]);
    return s;
  }
};

struct Problem {
  KvFormat format;
  HostKvPages pages;
  BatchInput batch;
  std::vector<float> q;  // [T][num_heads][head_dim], exact in bf16 and fp16
  int num_heads = 0;
  std::vector<double> vmax;  // [num_seqs][num_kv_heads]: max |v| over the context
};

// A float exactly representable in bf16 and in fp16 (normal range).
inline float ExactInHalfTypes(float x) {
  const float b = cpu::Bf16ToFloat(cpu::FloatToBf16(x));
  return std::fabs(b) < 1e-3f ? 0.0f : std::clamp(b, -60000.0f, 60000.0f);
}

inline Problem Build(const AttnCase& c) {
  absl::StatusOr<KvFormat> f =
      KvFormat::Create(c.dtype, c.num_kv_heads, c.head_dim, c.block_size, c.int4_group);
  REQUIRE(f.ok());
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int nb_seq = static_cast<int>(c.ctx.size());
  int total_blocks = 3;  // spares that no table names
  int max_blocks = 1;
  for (int len : c.ctx) {
    const int n = (len + c.block_size - 1) / c.block_size;
    total_blocks += n;
    max_blocks = std::max(max_blocks, n + 1);
  }
  Problem p{*f, HostKvPages(*f, 1, total_blocks), {}, {}, c.num_kv_heads * c.group, {}};
  std::memset(p.pages.layer(0), 0xff, p.pages.total_bytes());
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  BatchInput& b = p.batch;
  b.Clear();
  b.max_blocks_per_seq = max_blocks;
  b.block_table.assign(static_cast<size_t>(nb_seq) * max_blocks, -1);
  std::vector<int64_t> slots;
  int next = 0;
  for (int s = 0; s < nb_seq; ++s) {
    REQUIRE(c.q_len[s] <= c.ctx[s]);
    const int n = (c.ctx[s] + c.block_size - 1) / c.block_size;
    for (int i = 0; i < n; ++i) b.block_table[s * max_blocks + i] = ids[next++];
    for (int i = 0; i < c.ctx[s]; ++i) {
      slots.push_back(int64_t(b.block_table[s * max_blocks + i / c.block_size]) * c.block_size +
                      i % c.block_size);
    }
    b.context_len.push_back(c.ctx[s]);
    b.query_start.push_back(b.query_start.back() + c.q_len[s]);
    for (int r = 0; r < c.q_len[s]; ++r) {
      b.token_ids.push_back(0);
      b.positions.push_back(c.ctx[s] - c.q_len[s] + r);
      b.slot_mapping.push_back(slots[slots.size() - c.q_len[s] + r]);
    }
  }
  const size_t kv_elems = slots.size() * c.num_kv_heads * c.head_dim;
  std::vector<float> k(kv_elems), v(kv_elems);
  for (float& x : k) x = normal(rng);
  for (size_t i = 0; i < v.size(); ++i) v[i] = normal(rng) + (i % 3 == 0 ? 1.5f : 0.0f);
  cpu::KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.slot_mapping = slots.data();
  w.num_tokens = static_cast<int32_t>(slots.size());
  w.kv = LayerView(p.pages, 0);
  cpu::WriteKv(w);

  p.q.resize(static_cast<size_t>(b.num_tokens()) * p.num_heads * c.head_dim);
  for (float& x : p.q) x = ExactInHalfTypes(c.q_scale * normal(rng));

  // max |v| per (sequence, kv head), from the pages as decoded.
  const KvFormat& fmt = p.format;
  std::vector<float> row(c.head_dim);
  for (int s = 0; s < nb_seq; ++s) {
    for (int h = 0; h < c.num_kv_heads; ++h) {
      double m = 0.0;
      for (int i = 0; i < c.ctx[s]; ++i) {
        const uint8_t* block =
            p.pages.layer(0) + int64_t(b.BlockRow(s)[i / c.block_size]) * fmt.block_bytes();
        cpu::DequantizeRow(fmt.v(), c.head_dim, block + fmt.RowOffset(fmt.v(), h, i % c.block_size),
                           block + fmt.MetaOffset(fmt.v(), h, i % c.block_size), row.data());
        for (float x : row) m = std::max(m, double(std::fabs(x)));
      }
      p.vmax.push_back(m);
    }
  }
  return p;
}

// cpu::PagedAttention over all rows, on several threads (it is reentrant on
// disjoint row ranges).
inline std::vector<float> RunCpu(const Problem& p, int window) {
  std::vector<float> out(p.q.size(), -777.0f);
  cpu::PagedAttentionParams a;
  a.q = p.q.data();
  a.out = out.data();
  a.kv = LayerView(p.pages, 0);
  a.batch = ViewOf(p.batch);
  a.num_heads = p.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.format.head_dim()));
  a.sliding_window = window;
  const int parts = std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  const std::vector<int32_t> bounds = SplitRowsByAttentionCost(a.batch, window, parts, 64);
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    if (bounds[i] < bounds[i + 1]) {
      threads.emplace_back([&a, &bounds, i] { cpu::PagedAttention(a, bounds[i], bounds[i + 1]); });
    }
  }
  for (std::thread& th : threads) th.join();
  return out;
}

}  // namespace kvserve::testing

namespace kvserve::cuda::testing {

using ::kvserve::testing::AttnCase;
using ::kvserve::testing::Build;
using ::kvserve::testing::ExactInHalfTypes;
using ::kvserve::testing::Problem;
using ::kvserve::testing::RunCpu;

inline constexpr double kFp32Tol = 4e-5;

inline double Tolerance(ActDtype act) {
  switch (act) {
    case ActDtype::kBf16:
      return kFp32Tol + std::ldexp(1.0, -8);
    case ActDtype::kFp16:
      return kFp32Tol + std::ldexp(1.0, -11);
    default:
      return kFp32Tol;
  }
}

// The fast (tensor-core) kernel's tolerance, on top of Tolerance's: P is
// rounded to the compute type (2^-11 relative in fp16, 2^-8 in bf16, so at
// most that times max|v| in the output); quantized K and V are decoded to
// fp16 (within one fp16 rounding of the CPU's floats: V moves the output by
// 2^-11 max|v|; K moves each score by at most 2^-11 * scale * sum |q_c k_c|,
// about 0.6 sqrt(head_dim) q_scale * 2^-11 for these normal q and k, the
// output by about twice that). q is exact in both half types here.
inline double FastTolerance(KvDtype dtype, ActDtype act, float q_scale = 1.0f) {
  const double act_round = Tolerance(act) - kFp32Tol;  // the output's own rounding
  if (dtype == KvDtype::kBf16) return kFp32Tol + act_round + std::ldexp(1.0, -8);
  const double fp16_p = std::ldexp(1.0, -11);
  if (dtype == KvDtype::kFp16) return kFp32Tol + act_round + fp16_p;
  // V rounded (2^-11), and K rounded: scale * sum |q_c k_c| is about 0.6
  // sqrt(head_dim) q_scale for these normal q and k, so 2^-11 of it is at
  // most 4e-3 q_scale at head_dim 256 (the output moves about twice that
  // times a softmax weight; 1.5e-3 q_scale bounds what the sweep measures,
  // 5e-4 at q_scale 1, 3.4e-3 at 4).
  return kFp32Tol + act_round + fp16_p + std::ldexp(1.0, -11) + 1.5e-3 * q_scale;
}

inline const char* ActName(ActDtype a) {
  return a == ActDtype::kFp32 ? "fp32" : a == ActDtype::kFp16 ? "fp16" : "bf16";
}

inline std::vector<uint8_t> ToAct(const std::vector<float>& x, ActDtype act, int64_t row,
                                  int64_t pad) {
  const int64_t es = ActDtypeSize(act), rows = static_cast<int64_t>(x.size()) / row;
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * (row + pad) * es), 0xff);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < row; ++i) {
      const float f = x[r * row + i];
      uint8_t* dst = bytes.data() + (r * (row + pad) + i) * es;
      if (act == ActDtype::kFp32) {
        std::memcpy(dst, &f, 4);
      } else {
        const uint16_t h = act == ActDtype::kBf16 ? cpu::FloatToBf16(f) : cpu::FloatToFp16(f);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  return bytes;
}

inline float FromAct(const uint8_t* src, ActDtype act) {
  if (act == ActDtype::kFp32) {
    float f;
    std::memcpy(&f, src, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, src, 2);
  return act == ActDtype::kBf16 ? cpu::Bf16ToFloat(h) : cpu::Fp16ToFloat(h);
}

// max over elements of |gpu - cpu| / vmax(sequence, kv head); NaN -> inf.
inline double WorstError(const Problem& p, const std::vector<float>& gpu,
                         const std::vector<float>& cpu) {
  const int hd = p.format.head_dim(), nh = p.num_heads, group = nh / p.format.num_kv_heads();
  const BatchView v = ViewOf(p.batch);
  double worst = 0.0;
  int reported = 0;
  for (int32_t r = 0; r < v.num_tokens; ++r) {
    const int32_t s = v.SeqOfRow(r);
    for (int h = 0; h < nh; ++h) {
      const double vmax = std::max(p.vmax[s * p.format.num_kv_heads() + h / group], 1e-30);
      for (int d = 0; d < hd; ++d) {
        const size_t i = (size_t(r) * nh + h) * hd + d;
        double e = std::fabs(double(gpu[i]) - double(cpu[i])) / vmax;
        if (std::isnan(e)) e = INFINITY;
        if (e > worst && reported < 3 && e > kFp32Tol) {
          UNSCOPED_INFO("row " << r << " (seq " << s << ") head " << h << " ch " << d << ": gpu "
                               << gpu[i] << " cpu " << cpu[i] << " vmax " << vmax);
          ++reported;
        }
        worst = std::max(worst, e);
      }
    }
  }
  return worst;
}

}  // namespace kvserve::cuda::testing
