// The int4_kc CUDA kernels' source (seal, tail write, attention over sealed
// blocks + tail), run on the CPU by cuda_sim, against the CPU's int4_kc
// kernels on a layout with fp16 tails (what the CUDA backend uses): the seal
// and the tail write must produce exactly the CPU's bytes; attention must
// equal cpu::PagedAttention within paged_attention_sim_test's tolerance.
//
// Each case first builds the state before the step with the CPU kernels (a
// prefill of every sequence's earlier tokens: sealed blocks + a partial
// tail), then runs one step (decode rows, whole prompts, chunks that cross
// a block boundary) on both sides and compares pages, tails and outputs.
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim_more.h"  // first: the shims the kernel source needs
#include "kernels/cuda/kv_write_kc_kernel.cuh"
#include "kernels/cuda/paged_attention_kc_kernel.cuh"
// clang-format on

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_format.h"
#include "cache/kv_pages.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/gpu_attention_plan.h"
#include "kernels/paged_view.h"

// The attention kernel's dynamic shared memory (a plain array in the simulation).
namespace kvserve::cuda::attention_kc_detail {
alignas(16) float4 kc_smem4[SmemFloats(kGpuAttentionMaxHeadDim) / 4 + 1];
}  // namespace kvserve::cuda::attention_kc_detail

namespace kvserve::cuda {
namespace {

constexpr double kTol = 4e-5;  // paged_attention_sim_test's fp32 tolerance

struct KcCase {
  int head_dim = 64;
  int num_kv_heads = 2;
  int group = 1;
  int block_size = 16;
  int int4_group = 32;
  int window = 0;
  std::vector<int> ctx;    // context after the step
  std::vector<int> q_len;  // rows of the step
  uint32_t seed = 1;
  std::string Name() const {
    std::string s = absl::StrCat("hd", head_dim, " kv", num_kv_heads, " g", group, " bs",
                                 block_size, " int4g", int4_group, " w", window, " seqs");
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
Step MakeStep(const KcCase& c, const std::vector<std::vector<float>>& k_all,
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

cpu::KvBlockWriteParams CpuWrite(const Step& s, Pool& pool) {
  cpu::KvBlockWriteParams w;
  w.k = s.k.data();
  w.v = s.v.data();
  w.batch = ViewOf(s.batch);
  w.kv = LayerView(pool.pages, 0);
  return w;
}

KvKcWriteParams SimWrite(const Step& s, Pool& pool) {
  KvKcWriteParams w;
  w.k = s.k.data();
  w.v = s.v.data();
  w.k_stride = w.v_stride = int64_t(pool.pages.format(0).num_kv_heads()) *
                            pool.pages.format(0).head_dim();
  w.dtype = ActDtype::kFp32;
  w.batch = ViewOf(s.batch);
  w.kv = LayerView(pool.pages, 0);
  return w;
}

std::vector<float> CpuAttention(const KcCase& c, const Step& s, const std::vector<float>& q,
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

std::vector<float> SimAttention(const KcCase& c, const Step& s, const std::vector<float>& q,
                                Pool& pool, bool split) {
  using namespace attention_kc_detail;
  const int nh = c.num_kv_heads * c.group, hd = c.head_dim;
  const GpuAttentionShape shape{nh, c.num_kv_heads, hd, c.window};
  GpuAttentionPlanOptions options;
  if (split) {
    options.fixed_partition_keys = 16;
  } else {
    options.split = false;
  }
  absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(s.batch), shape, options);
  REQUIRE(plan.ok());
  std::vector<float> workspace(
      static_cast<size_t>(GpuAttentionWorkspaceBytes(shape, plan->header().num_partials) / 4));
  std::memset(workspace.data(), 0xff, workspace.size() * 4);
  std::vector<float> out(q.size());
  std::memset(out.data(), 0xff, out.size() * 4);
  KernelArgs a;
  a.q = q.data();
  a.out = out.data();
  a.q_stride = a.out_stride = int64_t(nh) * hd;
  a.dtype = ActDtype::kFp32;
  a.kv = LayerView(pool.pages, 0);
  a.batch = ViewOf(s.batch);
  a.num_heads = nh;
  a.group = c.group;
  a.heads_per_cta = plan->header().heads_per_cta;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.sliding_window = c.window;
  a.plan = plan->words().data();
  a.workspace = workspace.data();
  a.slot_floats = GpuAttentionSlotFloats(shape);
  a.new_k = s.k.data();
  a.new_v = s.v.data();
  a.new_k_stride = a.new_v_stride = int64_t(c.num_kv_heads) * hd;
  cuda_sim::Launch(AttentionKcKernel, dim3(plan->header().num_items, nh / a.heads_per_cta),
                   kThreads, kc_smem4, sizeof(kc_smem4), a);
  if (plan->header().num_merges > 0) {
    cuda_sim::Launch(MergeKcKernel, dim3(plan->header().num_merges), kThreads, nullptr, 0, a);
  }
  return out;
}

int DifferingBytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

void CheckCase(const KcCase& c) {
  INFO(c.Name());
  absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kInt4Kc, c.num_kv_heads, c.head_dim,
                                                c.block_size, c.int4_group, KvElem::kFp16);
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
  for (int q = 0; q < nseq; ++q) {
    k_all[q].resize(static_cast<size_t>(c.ctx[q]) * row);
    v_all[q].resize(k_all[q].size());
    // Channels of different magnitudes and offsets (what per-channel K is for).
    for (size_t i = 0; i < k_all[q].size(); ++i) {
      const int d = static_cast<int>(i % c.head_dim);
      k_all[q][i] = normal(rng) * (1.0f + (d % 5)) + (d % 3 == 0 ? 4.0f : 0.0f);
      v_all[q][i] = normal(rng) + (i % 3 == 0 ? 1.5f : 0.0f);
    }
  }

  Pool cpu_pool{HostKvPages(std::vector<KvFormat>{*f}, total_blocks, num_tails)};
  std::memset(cpu_pool.pages.layer(0), 0xff, cpu_pool.Blocks().size());
  std::memset(cpu_pool.pages.tails(0), 0xff, cpu_pool.Tails().size());
  // The state before the step: every sequence's earlier tokens, by the CPU.
  std::vector<int> zero(nseq, 0), first(nseq), end(c.ctx);
  for (int q = 0; q < nseq; ++q) first[q] = c.ctx[q] - c.q_len[q];
  const Step before = MakeStep(c, k_all, v_all, zero, first, table, max_blocks, tails);
  if (before.batch.num_tokens() > 0) {
    const cpu::KvBlockWriteParams w = CpuWrite(before, cpu_pool);
    cpu::FlushKvBlocks(w, 0, nseq);
    cpu::WriteKvTails(w, 0, before.batch.num_tokens());
  }
  Pool sim_pool{HostKvPages(std::vector<KvFormat>{*f}, total_blocks, num_tails)};
  sim_pool.CopyFrom(cpu_pool);

  const Step step = MakeStep(c, k_all, v_all, first, end, table, max_blocks, tails);
  const int32_t t = step.batch.num_tokens();
  // Seal.
  cpu::FlushKvBlocks(CpuWrite(step, cpu_pool), 0, nseq);
  const KvKcWriteParams sw = SimWrite(step, sim_pool);
  cuda_sim::Launch(kv_kc_detail::SealKernel<float>, dim3(nseq, c.num_kv_heads),
                   kv_kc_detail::kThreads, nullptr, 0, sw);
  REQUIRE(DifferingBytes(cpu_pool.Blocks(), sim_pool.Blocks()) == 0);
  REQUIRE(DifferingBytes(cpu_pool.Tails(), sim_pool.Tails()) == 0);

  // Attention over sealed blocks + tails + this step's rows.
  std::vector<float> q(static_cast<size_t>(t) * row * c.group);
  for (float& x : q) x = normal(rng);
  const std::vector<float> ref = CpuAttention(c, step, q, cpu_pool);
  double vmax = 0.0;
  for (const auto& v : v_all) {
    for (float x : v) vmax = std::max(vmax, double(std::fabs(x)));
  }
  for (bool split : {false, true}) {
    INFO((split ? "split" : "unsplit"));
    const std::vector<float> out = SimAttention(c, step, q, sim_pool, split);
    double worst = 0.0;
    for (size_t i = 0; i < out.size(); ++i) {
      double e = std::fabs(double(out[i]) - double(ref[i])) / vmax;
      if (std::isnan(e)) e = INFINITY;
      worst = std::max(worst, e);
    }
    INFO("worst error / max|v| = " << worst);
    REQUIRE(worst <= kTol);
  }

  // Tails.
  cpu::WriteKvTails(CpuWrite(step, cpu_pool), 0, t);
  const int64_t items = int64_t(t) * c.num_kv_heads * 2;
  cuda_sim::Launch(kv_kc_detail::TailKernel<float>,
                   dim3(static_cast<unsigned>((items + kv_kc_detail::kWarps - 1) /
                                              kv_kc_detail::kWarps)),
                   kv_kc_detail::kThreads, nullptr, 0, sw);
  REQUIRE(DifferingBytes(cpu_pool.Tails(), sim_pool.Tails()) == 0);
  REQUIRE(DifferingBytes(cpu_pool.Blocks(), sim_pool.Blocks()) == 0);
}

TEST_CASE("simulated CUDA int4_kc seal and tail write give the CPU's bytes, attention its values",
          "[kernels][cuda_sim][int4_kc]") {
  // Decode rows that complete a block, whole prompts, chunks after earlier
  // steps that cross a block boundary (sealing a block from tail + new rows),
  // a decode row deep in the context.
  uint32_t seed = 7;
  for (int hd : {8, 64}) {
    for (int group : {1, 4}) {
      for (int bs : {16, 32}) {
        KcCase c;
        c.head_dim = hd;
        c.group = group;
        c.block_size = bs;
        c.int4_group = hd == 8 ? 8 : 32;
        c.window = seed % 3 == 0 ? 7 : 0;
        c.ctx = {bs, 17, 2 * bs + 8, bs + 1 + 2, 70, 3 * bs};
        c.q_len = {1, 17, 5, 6, 1, 2 * bs + 3};
        c.seed = seed++;
        CheckCase(c);
      }
    }
  }
}

TEST_CASE("simulated CUDA int4_kc: head_dim 128, one kv head, a group of 3",
          "[kernels][cuda_sim][int4_kc]") {
  KcCase c;
  c.head_dim = 128;
  c.num_kv_heads = 1;
  c.group = 3;
  c.int4_group = 64;
  c.ctx = {40, 16};
  c.q_len = {9, 16};
  c.seed = 99;
  CheckCase(c);
}

}  // namespace
}  // namespace kvserve::cuda
