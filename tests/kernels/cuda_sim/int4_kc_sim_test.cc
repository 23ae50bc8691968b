// The int4_kc / int2_kc CUDA kernels' source (seal, tail write, attention
// over sealed blocks + tail; one kernel each, the code bits a runtime value),
// run on the CPU by cuda_sim, against the CPU's kc kernels on a layout with
// fp16 tails (what the CUDA backend uses): the seal
// and the tail write must produce exactly the CPU's bytes; attention must
// equal cpu::PagedAttention within paged_attention_sim_test's tolerance.
//
// Each case first builds the state before the step with the CPU kernels (a
// prefill of every sequence's earlier tokens: sealed blocks + a partial
// tail), then runs one step (decode rows, whole prompts, chunks that cross
// a block boundary) on both sides and compares pages, tails and outputs.
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim_more.h"  // first: the shims the kernel source needs
#include "kernels/cuda/kv/kv_write_kc_kernel.cuh"
#include "kernels/cuda/attention/paged_attention_kc_kernel.cuh"
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
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/paged_view.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/kc_problem.h"

// The attention kernel's dynamic shared memory (a plain array in the simulation).
namespace kvserve::cuda::attention_kc_detail {
alignas(16) float4 kc_smem4[SmemFloats(kGpuAttentionMaxHeadDim) / 4 + 1];
}  // namespace kvserve::cuda::attention_kc_detail

namespace kvserve::cuda {
namespace {

using namespace ::kvserve::testing::kc;  // NOLINT: the shared problem

// x in an activation type (exact when the problem is bf16_exact).
std::vector<uint8_t> AsAct(const std::vector<float>& x, ActDtype act) {
  std::vector<uint8_t> out(x.size() * ActDtypeSize(act));
  for (size_t i = 0; i < x.size(); ++i) {
    if (act == ActDtype::kBf16) {
      const uint16_t b = cpu::FloatToBf16(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    }
  }
  return out;
}

float FromAct(const uint8_t* p, ActDtype act) {
  if (act == ActDtype::kBf16) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return cpu::Bf16ToFloat(b);
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// The step's rows in the activation type the simulated kernels read.
struct SimRows {
  ActDtype act;
  std::vector<uint8_t> k, v, q;
};

KvKcWriteParams SimWrite(const Step& s, const SimRows& rows, Pool& pool) {
  KvKcWriteParams w;
  w.k = rows.k.data();
  w.v = rows.v.data();
  w.k_stride = w.v_stride =
      int64_t(pool.pages.format(0).num_kv_heads()) * pool.pages.format(0).head_dim();
  w.dtype = rows.act;
  w.batch = ViewOf(s.batch);
  w.kv = LayerView(pool.pages, 0);
  return w;
}

std::vector<float> SimAttention(const KcCase& c, const Step& s, const SimRows& rows, Pool& pool,
                                bool split) {
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
  std::vector<float> workspace(  // poisoned: every bit set (NaN); may be empty
      static_cast<size_t>(GpuAttentionWorkspaceBytes(shape, plan->header().num_partials) / 4),
      __uint_as_float(0xffffffffu));
  const int64_t n = static_cast<int64_t>(rows.q.size() / ActDtypeSize(rows.act));
  std::vector<uint8_t> out(rows.q.size(), 0xff);
  KernelArgs a;
  a.q = rows.q.data();
  a.out = out.data();
  a.q_stride = a.out_stride = int64_t(nh) * hd;
  a.dtype = rows.act;
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
  a.new_k = rows.k.data();
  a.new_v = rows.v.data();
  a.new_k_stride = a.new_v_stride = int64_t(c.num_kv_heads) * hd;
  cuda_sim::Launch(AttentionKcKernel, dim3(plan->header().num_items, nh / a.heads_per_cta),
                   kThreads, kc_smem4, sizeof(kc_smem4), a);
  if (plan->header().num_merges > 0) {
    cuda_sim::Launch(MergeKcKernel,
                     attention_skeleton::MergeGrid(plan->header().num_merges, a.num_heads),
                     kThreads, nullptr, 0, a);
  }
  std::vector<float> result(n);
  for (int64_t i = 0; i < n; ++i)
    result[i] = FromAct(out.data() + i * ActDtypeSize(rows.act), rows.act);
  return result;
}

void CheckCase(const KcCase& c, ActDtype act = ActDtype::kFp32) {
  INFO(c.Name() << (act == ActDtype::kBf16 ? " bf16 activations" : ""));
  const KcProblem p = BuildKcProblem(c);
  const SimRows rows{act, AsAct(p.step.k, act), AsAct(p.step.v, act), AsAct(p.q, act)};
  Pool sim{HostKvPages(std::vector<KvFormat>{p.before.pages.format(0)}, p.before.pages.num_blocks(),
                       p.before.pages.num_tails())};
  sim.CopyFrom(p.before);
  const int32_t t = p.step.batch.num_tokens();
  // Seal.
  const KvKcWriteParams sw = SimWrite(p.step, rows, sim);
  auto launch = [&](auto kernel, dim3 grid) {
    cuda_sim::Launch(kernel, grid, kv_kc_detail::kThreads, nullptr, 0, sw);
  };
  if (act == ActDtype::kBf16) {
    launch(kv_kc_detail::SealKernel<__nv_bfloat16>, dim3(p.num_seqs, c.num_kv_heads));
  } else {
    launch(kv_kc_detail::SealKernel<float>, dim3(p.num_seqs, c.num_kv_heads));
  }
  REQUIRE(DifferingBytes(p.sealed.Blocks(), sim.Blocks()) == 0);
  REQUIRE(DifferingBytes(p.sealed.Tails(), sim.Tails()) == 0);
  // Attention over sealed blocks + tails + this step's rows.
  for (bool split : {false, true}) {
    INFO((split ? "split" : "unsplit"));
    const double worst = WorstError(SimAttention(c, p.step, rows, sim, split), p.out, p.vmax);
    // bf16 output: one rounding of a value up to max|v| (paged_attention_sim_test's bound).
    const double tol = act == ActDtype::kBf16 ? kTol + std::ldexp(1.0, -8) : kTol;
    INFO("worst error / max|v| = " << worst << ", tolerance " << tol);
    REQUIRE(worst <= tol);
  }
  // Tails.
  const int64_t items = int64_t(t) * c.num_kv_heads * 2;
  const dim3 tail_grid(
      static_cast<unsigned>((items + kv_kc_detail::kWarps - 1) / kv_kc_detail::kWarps));
  if (act == ActDtype::kBf16) {
    launch(kv_kc_detail::TailKernel<__nv_bfloat16>, tail_grid);
  } else {
    launch(kv_kc_detail::TailKernel<float>, tail_grid);
  }
  REQUIRE(DifferingBytes(p.written.Tails(), sim.Tails()) == 0);
  REQUIRE(DifferingBytes(p.written.Blocks(), sim.Blocks()) == 0);
}

TEST_CASE("simulated CUDA int4_kc seal and tail write give the CPU's bytes, attention its values",
          "[kernels][cuda_sim][int4_kc]") {
  // Decode rows that complete a block, whole prompts, chunks after earlier
  // steps that cross a block boundary (sealing a block from tail + new rows),
  // a decode row deep in the context.
  uint32_t seed = 7;
  for (KvDtype dtype : {KvDtype::kInt4Kc, KvDtype::kInt2Kc})
    for (int hd : {8, 64}) {
      for (int group : {1, 4}) {
        for (int bs : {16, 32}) {
          KcCase c;
          c.dtype = dtype;
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
  c.dtype = GENERATE(KvDtype::kInt4Kc, KvDtype::kInt2Kc);
  c.head_dim = 128;
  c.num_kv_heads = 1;
  c.group = 3;
  c.int4_group = 64;
  c.ctx = {40, 16};
  c.q_len = {9, 16};
  c.seed = 99;
  CheckCase(c);
}

TEST_CASE("simulated CUDA int4_kc with bf16 activations: the same bytes, bf16 outputs",
          "[kernels][cuda_sim][int4_kc]") {
  KcCase c;
  c.dtype = GENERATE(KvDtype::kInt4Kc, KvDtype::kInt2Kc);
  c.head_dim = 32;
  c.group = 2;
  c.int4_group = 16;
  c.ctx = {16, 37, 50};
  c.q_len = {1, 9, 50};
  c.bf16_exact = true;
  c.seed = 5;
  CheckCase(c, ActDtype::kBf16);
}

TEST_CASE("simulated CUDA int4_kc: scores far past the fp32 range of exp stay finite",
          "[kernels][cuda_sim][int4_kc]") {
  // Queries scaled by 100 give scores of hundreds (exp overflows fp32 above
  // about 88.7): the softmax and the merge must subtract their maxima.
  KcCase c;
  c.dtype = GENERATE(KvDtype::kInt4Kc, KvDtype::kInt2Kc);
  c.head_dim = 16;
  c.group = 2;
  c.int4_group = 8;
  c.ctx = {17, 40, 70};
  c.q_len = {17, 5, 1};
  c.q_scale = 100.0f;
  c.seed = 11;
  CheckCase(c);
}

}  // namespace
}  // namespace kvserve::cuda
