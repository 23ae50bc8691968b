// The CUDA paged-attention kernels' source, run on the CPU by cuda_sim.h
// (fibers for threads, exact barriers and shuffles, NaN-poisoned shared
// memory), against cpu::PagedAttention on the same pages: the device code's
// indexing, masking, online softmax, split-KV partials and merge are checked
// in make test on machines without a GPU. Small cases only (the simulation
// is slow); the [gpu] tests run the full sweep on a device. Same problems,
// poisoning and tolerances as tests/kernels/cuda/paged_attention_test.cc.
//
// The launch arguments are built here as paged_attention.cu builds them
// (that file's validation is covered by the [gpu] tests).
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim.h"  // first: the shims the kernel source needs
#include "kernels/cuda/paged_attention_kernel.cuh"
// clang-format on

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gpu_attention_plan.h"
#include "tests/kernels/attention_problem.h"

// The kernel's `extern __shared__` dynamic shared memory.
namespace kvserve::cuda::attention_detail {
alignas(16) float4 smem4[SmemFloats(kGpuAttentionMaxHeadDim) / 4 + 1];
}  // namespace kvserve::cuda::attention_detail

namespace kvserve::cuda {
namespace {

using namespace ::kvserve::cuda::testing;  // NOLINT: the shared problem helpers
using attention_detail::KernelArgs;

struct SimSetup {
  ActDtype act = ActDtype::kFp32;
  GpuAttentionPlanOptions options;
};

// Runs the simulated kernels; out padding (3 elements a row) must stay poisoned.
std::vector<float> RunSim(const Problem& p, int window, const SimSetup& setup) {
  const int hd = p.format.head_dim();
  const int64_t row = int64_t(p.num_heads) * hd, pad = 3;
  const int32_t t = p.batch.num_tokens();
  const int64_t es = ActDtypeSize(setup.act);
  const std::vector<uint8_t> q = ToAct(p.q, setup.act, row, pad);
  std::vector<uint8_t> out(static_cast<size_t>(t * (row + pad) * es), 0xff);

  const GpuAttentionShape shape{p.num_heads, p.format.num_kv_heads(), hd, window};
  absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(p.batch), shape, setup.options);
  REQUIRE(plan.ok());
  std::vector<float> workspace(
      static_cast<size_t>(GpuAttentionWorkspaceBytes(shape, plan->header().num_partials) / 4));
  std::memset(workspace.data(), 0xff, workspace.size() * 4);

  KernelArgs a;
  a.q = q.data();
  a.out = out.data();
  a.q_stride = row + pad;
  a.out_stride = row + pad;
  a.dtype = setup.act;
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

  const dim3 grid(plan->header().num_items, p.num_heads / a.heads_per_cta);
  const attention_detail::KernelFn kernel =
      attention_detail::AttentionKernelFor(p.format.k().elem, p.format.v().elem);
  REQUIRE(kernel != nullptr);
  cuda_sim::Launch(kernel, grid, attention_detail::kThreads, attention_detail::smem4,
                   sizeof(attention_detail::smem4), a);
  if (plan->header().num_merges > 0) {
    cuda_sim::Launch(attention_detail::MergeKernel, dim3(plan->header().num_merges),
                     attention_detail::kThreads, nullptr, 0, a);
  }

  std::vector<float> result(static_cast<size_t>(t * row));
  int bad_pad = 0;
  for (int64_t r = 0; r < t; ++r) {
    const uint8_t* src = out.data() + r * (row + pad) * es;
    for (int64_t i = 0; i < row; ++i) result[r * row + i] = FromAct(src + i * es, setup.act);
    for (int64_t i = row * es; i < (row + pad) * es; ++i) bad_pad += src[i] != 0xff;
  }
  REQUIRE(bad_pad == 0);
  return result;
}

void CheckSim(const AttnCase& c, const std::vector<SimSetup>& setups) {
  INFO(c.Name());
  const Problem p = Build(c);
  const std::vector<float> ref = RunCpu(p, c.window);
  for (const SimSetup& s : setups) {
    INFO(ActName(s.act) << (s.options.split ? "" : " nosplit") << " fixed "
                        << s.options.fixed_partition_keys);
    const double err = WorstError(p, RunSim(p, c.window, s), ref);
    INFO("worst error / max|v| = " << err << ", tolerance " << Tolerance(s.act));
    REQUIRE(err <= Tolerance(s.act));
  }
}

// Unsplit, and split into 16-key partitions (most rows merged).
std::vector<SimSetup> Setups() {
  SimSetup none;
  none.options.split = false;
  SimSetup split;
  split.options.fixed_partition_keys = 16;
  return {none, split};
}

TEST_CASE("simulated CUDA attention matches the CPU kernel over every format",
          "[kernels][cuda_sim]") {
  // A first decode row, a whole 17-token prompt, a 5-row chunk after a
  // prefix hit, and a decode row at 70, in one shuffled pool.
  uint32_t seed = 1;
  for (KvDtype dtype : kAllKvDtypes) {
    for (int hd : {8, 64}) {
      for (int group : {1, 4}) {
        AttnCase c;
        c.dtype = dtype;
        c.head_dim = hd;
        c.group = group;
        c.block_size = seed % 3 == 0 ? 1 : 16;
        c.int4_group = 32;
        c.window = seed % 2 == 0 ? 7 : 0;
        c.ctx = {1, 17, 40, 70};
        c.q_len = {1, 17, 5, 1};
        c.seed = seed++;
        CheckSim(c, Setups());
      }
    }
  }
}

TEST_CASE("simulated CUDA attention: bf16 and fp16 activations, peaky softmax",
          "[kernels][cuda_sim]") {
  std::vector<SimSetup> setups = Setups();
  for (ActDtype act : {ActDtype::kBf16, ActDtype::kFp16}) {
    SimSetup s;
    s.act = act;
    s.options.fixed_partition_keys = 32;
    setups.push_back(s);
  }
  AttnCase c;
  c.dtype = KvDtype::kK8V4;
  c.head_dim = 64;
  c.group = 2;
  c.ctx = {90, 9};
  c.q_len = {2, 9};
  c.q_scale = 8.0f;
  c.seed = 42;
  CheckSim(c, setups);
}

TEST_CASE("simulated CUDA attention: wide and odd GQA groups, head_dim 256 and 6",
          "[kernels][cuda_sim]") {
  struct {
    KvDtype dtype;
    int hd, kv, group, int4_group;
  } shapes[] = {{KvDtype::kFp16, 16, 1, 32, 16},  // 16 heads per CTA, two CTAs per kv head
                {KvDtype::kInt4, 16, 2, 3, 8},    // 3 heads, 5 rows per tile
                {KvDtype::kBf16, 256, 1, 2, 64},  // the largest shared-memory tile
                {KvDtype::kInt4, 6, 1, 2, 2}};    // channel pairs that are not vectors
  uint32_t seed = 200;
  for (const auto& sh : shapes) {
    AttnCase c;
    c.dtype = sh.dtype;
    c.head_dim = sh.hd;
    c.num_kv_heads = sh.kv;
    c.group = sh.group;
    c.int4_group = sh.int4_group;
    c.ctx = {33, 12};
    c.q_len = {1, 12};
    c.seed = seed++;
    CheckSim(c, Setups());
  }
}

TEST_CASE("simulated CUDA attention: scores far past the fp32 range of exp stay finite",
          "[kernels][cuda_sim]") {
  // Queries scaled by 100 give scores of hundreds (exp overflows fp32 above
  // about 88.7): the online softmax must subtract its running maximum, and
  // the merge the partitions' maximum.
  std::vector<SimSetup> setups = Setups();
  SimSetup bf16;
  bf16.act = ActDtype::kBf16;
  bf16.options.fixed_partition_keys = 32;
  setups.push_back(bf16);
  uint32_t seed = 400;
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kInt8}) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 16;
    c.group = 2;
    c.int4_group = 8;
    c.ctx = {1, 40, 70};
    c.q_len = {1, 5, 1};
    c.q_scale = 100.0f;
    c.seed = seed++;
    CheckSim(c, setups);
  }
}

}  // namespace
}  // namespace kvserve::cuda
