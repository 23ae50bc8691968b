// int4_kc / int2_kc kernel problems shared by the simulated
// (tests/kernels/cuda_sim) and the [gpu] (tests/kernels/cuda) tests of the
// CUDA kc kernels: one layer of int4_kc or int2_kc pages with fp16 tails (the CUDA layout), the
// state before a step built by the CPU kernels (a prefill of every sequence's earlier tokens:
// sealed blocks + a partial tail), the step's batch and rows, and the CPU's results (seal,
// attention, tails) for it.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/paged_view.h"

namespace kvserve::testing::kc {

constexpr double kTol = 4e-5;  // paged_attention_sim_test's fp32 tolerance

struct KcCase {
  KvDtype dtype = KvDtype::kInt4Kc;  // or kInt2Kc
  int head_dim = 64;
  int num_kv_heads = 2;
  int group = 1;
  int block_size = 16;
  int int4_group = 32;
  int window = 0;
  std::vector<int> ctx;    // context after the step
  std::vector<int> q_len;  // rows of the step
  uint32_t seed = 1;
  // Every K, V and q value exact in bf16 (so a bf16 copy is the same input).
  bool bf16_exact = false;
  float q_scale = 1.0f;  // > 1 makes the scores large and the softmax peaky
  std::string Name() const {
    std::string s = absl::StrCat(std::string(KvDtypeName(dtype)), " hd", head_dim, " kv",
                                 num_kv_heads, " g", group, " bs", block_size, " int4g", int4_group,
                                 " w", window, " qs", q_scale, " seqs");
    for (size_t i = 0; i < ctx.size(); ++i) absl::StrAppend(&s, " ", ctx[i], "/", q_len[i]);
    return s;
  }
};

// One layer of pages + tails, copyable (the CPU and the simulation each own one).
struct Pool {
  HostKvPages pages;
  std::vector<uint8_t> Blocks() const {
    const uint8_t* p = pages.layer(0);
    return {p, p + pages.num_blocks() * pages.format(0).block_bytes()};
  }
  std::vector<uint8_t> Tails() const {
    const uint8_t* p = pages.tails(0);
    return {p, p + pages.num_tails() * pages.format(0).tail_block_bytes()};
  }
  void CopyFrom(const Pool& o) {
    const std::vector<uint8_t> b = o.Blocks(), t = o.Tails();
    std::memcpy(pages.layer(0), b.data(), b.size());
    std::memcpy(pages.tails(0), t.data(), t.size());
  }
};

struct Step {
  BatchInput batch;
  std::vector<float> k, v;  // [T][hkv][hd]
};

// Rows [from, to) of every sequence as one batch; block tables and tails
// from the case's assignment.
inline Step MakeStep(const KcCase& c, const std::vector<std::vector<float>>& k_all,
                     const std::vector<std::vector<float>>& v_all, const std::vector<int>& from,
                     const std::vector<int>& to, const std::vector<int32_t>& table, int max_blocks,
                     const std::vector<int32_t>& tails) {
  Step s;
  BatchInput& b = s.batch;
  b.Clear();
  b.max_blocks_per_seq = max_blocks;
  b.block_table = table;
  const int row = c.num_kv_heads * c.head_dim;
  for (size_t q = 0; q < c.ctx.size(); ++q) {
    b.context_len.push_back(to[q]);
    b.query_start.push_back(b.query_start.back() + (to[q] - from[q]));
    b.tail_ids.push_back(tails[q]);
    for (int i = from[q]; i < to[q]; ++i) {
      b.token_ids.push_back(0);
      b.positions.push_back(i);
      b.slot_mapping.push_back(-1);
      s.k.insert(s.k.end(), k_all[q].begin() + int64_t(i) * row,
                 k_all[q].begin() + int64_t(i + 1) * row);
      s.v.insert(s.v.end(), v_all[q].begin() + int64_t(i) * row,
                 v_all[q].begin() + int64_t(i + 1) * row);
    }
  }
  return s;
}

inline cpu::KvBlockWriteParams CpuWrite(const Step& s, Pool& pool) {
  cpu::KvBlockWriteParams w;
  w.k = s.k.data();
  w.v = s.v.data();
  w.batch = ViewOf(s.batch);
  w.kv = LayerView(pool.pages, 0);
  return w;
}

inline std::vector<float> CpuAttention(const KcCase& c, const Step& s, const std::vector<float>& q,
                                       Pool& pool) {
  std::vector<float> out(q.size(), -777.0f);
  cpu::PagedAttentionParams a;
  a.q = q.data();
  a.out = out.data();
  a.kv = LayerView(pool.pages, 0);
  a.batch = ViewOf(s.batch);
  a.num_heads = c.num_kv_heads * c.group;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.sliding_window = c.window;
  a.new_k = s.k.data();
  a.new_v = s.v.data();
  cpu::PagedAttention(a, 0, s.batch.num_tokens());
  return out;
}

inline int DifferingBytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// A case's state before the step (CPU-built), the step, and the CPU's
// pools after the seal, after the tail write, and its attention output.
struct KcProblem {
  int num_seqs = 0;
  Pool before;  // the state before the step
  Step step;
  std::vector<float> q;    // [T][num_heads][head_dim]
  Pool sealed;             // before + cpu::FlushKvBlocks
  std::vector<float> out;  // cpu::PagedAttention on `sealed`
  Pool written;            // sealed + cpu::WriteKvTails
  double vmax = 0.0;       // max |v| over every row (error scale)
};

inline KcProblem BuildKcProblem(const KcCase& c) {
  absl::StatusOr<KvFormat> f = KvFormat::Create(c.dtype, c.num_kv_heads, c.head_dim, c.block_size,
                                                c.int4_group, KvElem::kFp16);
  REQUIRE(f.ok());
  const int nseq = static_cast<int>(c.ctx.size());
  const int bs = c.block_size, row = c.num_kv_heads * c.head_dim;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  // Shuffled block ids and tail ids, spares that no sequence names.
  int total_blocks = 3, max_blocks = 1;
  for (int len : c.ctx) {
    total_blocks += (len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs + 1);
  }
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(nseq) * max_blocks, -1);
  int next = 0;
  for (int q = 0; q < nseq; ++q) {
    for (int i = 0; i < (c.ctx[q] + bs - 1) / bs; ++i) table[q * max_blocks + i] = ids[next++];
  }
  const int num_tails = nseq + 2;
  std::vector<int32_t> tails(num_tails);
  std::iota(tails.begin(), tails.end(), 0);
  std::shuffle(tails.begin(), tails.end(), rng);
  tails.resize(nseq);

  std::vector<std::vector<float>> k_all(nseq), v_all(nseq);
  double vmax = 0.0;
  for (int q = 0; q < nseq; ++q) {
    k_all[q].resize(static_cast<size_t>(c.ctx[q]) * row);
    v_all[q].resize(k_all[q].size());
    // Channels of different magnitudes and offsets (what per-channel K is for).
    for (size_t i = 0; i < k_all[q].size(); ++i) {
      const int d = static_cast<int>(i % c.head_dim);
      k_all[q][i] = normal(rng) * (1.0f + (d % 5)) + (d % 3 == 0 ? 4.0f : 0.0f);
      v_all[q][i] = normal(rng) + (i % 3 == 0 ? 1.5f : 0.0f);
      if (c.bf16_exact) {
        k_all[q][i] = cpu::Bf16ToFloat(cpu::FloatToBf16(k_all[q][i]));
        v_all[q][i] = cpu::Bf16ToFloat(cpu::FloatToBf16(v_all[q][i]));
      }
      vmax = std::max(vmax, double(std::fabs(v_all[q][i])));
    }
  }
  auto make_pool = [&] {
    return Pool{HostKvPages(std::vector<KvFormat>{*f}, total_blocks, num_tails)};
  };
  KcProblem p{nseq, make_pool(), {}, {}, make_pool(), {}, make_pool(), vmax};
  std::memset(p.before.pages.layer(0), 0xff, p.before.Blocks().size());
  std::memset(p.before.pages.tails(0), 0xff, p.before.Tails().size());
  std::vector<int> zero(nseq, 0), first(nseq), end(c.ctx);
  for (int q = 0; q < nseq; ++q) first[q] = c.ctx[q] - c.q_len[q];
  const Step prior = MakeStep(c, k_all, v_all, zero, first, table, max_blocks, tails);
  if (prior.batch.num_tokens() > 0) {
    const cpu::KvBlockWriteParams w = CpuWrite(prior, p.before);
    cpu::FlushKvBlocks(w, 0, nseq);
    cpu::WriteKvTails(w, 0, prior.batch.num_tokens());
  }
  p.step = MakeStep(c, k_all, v_all, first, end, table, max_blocks, tails);
  p.q.resize(static_cast<size_t>(p.step.batch.num_tokens()) * row * c.group);
  for (float& x : p.q) {
    x = c.q_scale * normal(rng);
    if (c.bf16_exact) x = cpu::Bf16ToFloat(cpu::FloatToBf16(x));
  }
  p.sealed.CopyFrom(p.before);
  cpu::FlushKvBlocks(CpuWrite(p.step, p.sealed), 0, nseq);
  p.out = CpuAttention(c, p.step, p.q, p.sealed);
  p.written.CopyFrom(p.sealed);
  cpu::WriteKvTails(CpuWrite(p.step, p.written), 0, p.step.batch.num_tokens());
  return p;
}

inline double WorstError(const std::vector<float>& got, const std::vector<float>& ref,
                         double vmax) {
  REQUIRE(got.size() == ref.size());
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(double(got[i]) - double(ref[i])) / vmax;
    if (std::isnan(e)) e = INFINITY;
    worst = std::max(worst, e);
  }
  return worst;
}

}  // namespace kvserve::testing::kc
