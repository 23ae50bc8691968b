// The paged attention kernels (the reference kernel of
// paged_attention_kernel.cuh and the fast one of
// paged_attention_mma_kernel.cuh) run by cuda_sim on an attention problem
// (tests/kernels/attention_problem.h): the launch arguments built as
// kernels/cuda/attention/paged_attention.cu builds them, the attention kernel and the
// merge, q and out in the run's activation type with 3 poisoned elements of
// row padding that must stay poisoned. For the simulated-kernel tests.
#pragma once

// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim_more.h"  // first: the shims the kernel source needs
#include "kernels/cuda/attention/paged_attention_mma_kernel.cuh"
// clang-format on

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/attention_problem.h"

namespace kvserve::cuda::testing {

struct SimRun {
  ActDtype act = ActDtype::kFp32;
  GpuAttentionPlanOptions options;
  bool fast = false;    // the fast kernel, else the reference one
  unsigned grid_x = 0;  // 0: one CTA per work item; else a persistent grid this wide
  // Sinks: num_sinks per sequence and a sink query like q (empty: none).
  std::vector<int32_t> num_sinks;
  std::vector<float> sink_q;
};

// Runs one simulated kernel and the merge; out padding must stay poisoned.
inline std::vector<float> RunSim(const Problem& p, int window, const SimRun& run) {
  const int hd = p.format.head_dim();
  const int64_t row = int64_t(p.num_heads) * hd, pad = 3;
  const int32_t t = p.batch.num_tokens();
  const int64_t es = ActDtypeSize(run.act);
  const std::vector<uint8_t> q = ToAct(p.q, run.act, row, pad);
  std::vector<uint8_t> sink_q;
  if (!run.sink_q.empty()) sink_q = ToAct(run.sink_q, run.act, row, pad);
  std::vector<uint8_t> out(static_cast<size_t>(t * (row + pad) * es), 0xff);

  const GpuAttentionShape shape{p.num_heads, p.format.num_kv_heads(), hd, window};
  absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(p.batch), shape, run.options);
  REQUIRE(plan.ok());
  std::vector<float> workspace(  // poisoned: every bit set (NaN); may be empty
      static_cast<size_t>(GpuAttentionWorkspaceBytes(shape, plan->header().num_partials) / 4),
      __uint_as_float(0xffffffffu));

  attention_detail::KernelArgs a;
  a.q = q.data();
  a.out = out.data();
  a.q_stride = row + pad;
  a.out_stride = row + pad;
  a.dtype = run.act;
  a.kv = LayerView(p.pages, 0);
  a.batch = ViewOf(p.batch);
  a.num_heads = p.num_heads;
  a.group = p.num_heads / p.format.num_kv_heads();
  a.heads_per_cta = plan->header().heads_per_cta;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.sliding_window = window;
  a.plan = plan->words().data();
  a.workspace = workspace.data();
  a.slot_floats = GpuAttentionSlotFloats(shape);
  if (!run.num_sinks.empty()) {
    a.sink_q = sink_q.data();
    a.num_sinks = run.num_sinks.data();
  }

  const dim3 grid(run.grid_x > 0 ? run.grid_x : plan->header().num_items,
                  p.num_heads / a.heads_per_cta);
  const KvElem ke = p.format.k().elem, ve = p.format.v().elem;
  const attention_detail::KernelFn kernel =
      run.fast ? attention_detail::MmaAttentionKernelFor(ke, ve, hd)
               : attention_detail::AttentionKernelFor(ke, ve);
  REQUIRE(kernel != nullptr);
  if (run.fast) REQUIRE(attention_detail::MmaAttentionSupports(a.kv.layout));
  const size_t smem_bytes =
      run.fast ? static_cast<size_t>(
                     attention_detail::MmaSmemLayout(a.kv.layout, a.num_sinks != nullptr).total)
               : static_cast<size_t>(attention_detail::SmemFloats(hd)) * 4;
  std::vector<float4> smem(smem_bytes / 16 + 1);
  cuda_sim::Launch(kernel, grid, attention_detail::kThreads, smem.data(), smem_bytes, a);
  if (plan->header().num_merges > 0) {
    cuda_sim::Launch(attention_detail::MergeKernel,
                     attention_skeleton::MergeGrid(plan->header().num_merges, a.num_heads),
                     attention_detail::kThreads, nullptr, 0, a);
  }

  std::vector<float> result(static_cast<size_t>(t * row));
  int bad_pad = 0;
  for (int64_t r = 0; r < t; ++r) {
    const uint8_t* src = out.data() + r * (row + pad) * es;
    for (int64_t i = 0; i < row; ++i) result[r * row + i] = FromAct(src + i * es, run.act);
    for (int64_t i = row * es; i < (row + pad) * es; ++i) bad_pad += src[i] != 0xff;
  }
  REQUIRE(bad_pad == 0);
  return result;
}

}  // namespace kvserve::cuda::testing
