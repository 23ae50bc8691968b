// The fast (tensor-core) paged attention kernel's source run on the CPU by
// cuda_sim (simulated mma, ldmatrix and cp.async from the PTX tables; a
// copy read before its wait reads NaN poison), against cpu::PagedAttention
// on the same NaN-poisoned, shuffled pages, and against the simulated
// reference kernel where the CPU has no counterpart (sink queries). Every
// format the kernel takes, head_dim 64 / 128 / 256, block sizes 1, 16 and
// 32, GQA 1, 4 and 8, windows, split and unsplit plans, mixed batches of
// decode rows, whole prompts and chunks after a prefix hit.
//
// Tolerances (error / max|v| of the sequence's kv head, as in
// tests/kernels/cuda/attention/paged_attention_test.cc): the fp32 bound of the
// reference kernel, plus the fast kernel's roundings: P is rounded to the
// compute type (relative 2^-11 for fp16, 2^-8 for bf16, so at most that
// times max|v| in the output); quantized K and V are the CPU's decoded
// floats rounded to fp16 (V: 2^-11 max|v|; K: each score moves by at most
// 2^-11 * scale * sum |q_c k_c|, a few 1e-3 here, and the output by about
// twice that times max|v|). q is exact in both half types in these problems.
// clang-format off
#include "tests/kernels/cuda_sim/attention_sim_run.h"  // first: the simulator and the kernels
// clang-format on

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/attention_problem.h"

namespace kvserve::cuda {
namespace {

using namespace ::kvserve::cuda::testing;  // NOLINT: the shared problem helpers

// The fast kernel by default.
struct Run : SimRun {
  Run() { fast = true; }
};

std::vector<GpuAttentionPlanOptions> Plans() {
  GpuAttentionPlanOptions none;
  none.split = false;
  GpuAttentionPlanOptions split;
  split.fixed_partition_keys = 64;
  return {none, split};
}

void CheckAgainstCpu(const AttnCase& c, ActDtype act = ActDtype::kFp32) {
  INFO(c.Name() << " act " << ActName(act));
  const Problem p = Build(c);
  const std::vector<float> ref = RunCpu(p, c.window);
  for (const GpuAttentionPlanOptions& o : Plans()) {
    INFO((o.split ? "split 64" : "unsplit"));
    Run run;
    run.act = act;
    run.options = o;
    const double err = WorstError(p, RunSim(p, c.window, run), ref);
    const double tol = FastTolerance(c.dtype, act, c.q_scale);
    INFO("worst error / max|v| = " << err << ", tolerance " << tol);
    REQUIRE(err <= tol);
  }
}

constexpr KvDtype kFastDtypes[] = {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp8E4m3,
                                   KvDtype::kInt8, KvDtype::kInt4, KvDtype::kK8V4};

TEST_CASE("simulated fast CUDA attention matches the CPU kernel over every format it takes",
          "[kernels][cuda_sim]") {
  // A first decode row, a whole 17-token prompt, a 5-row chunk after a
  // prefix hit at 97, and a decode row at 70, in one shuffled pool.
  uint32_t seed = 1;
  for (KvDtype dtype : kFastDtypes) {
    for (int hd : {64, 128}) {
      for (int group : {1, 4, 8}) {
        AttnCase c;
        c.dtype = dtype;
        c.head_dim = hd;
        c.group = group;
        c.num_kv_heads = group == 8 ? 1 : 2;
        c.block_size = seed % 3 == 0 ? 32 : 16;
        c.int4_group = 32;
        c.window = seed % 4 == 1 ? 7 : 0;
        c.ctx = {1, 17, 97, 70};
        c.q_len = {1, 17, 5, 1};
        c.seed = seed++;
        CheckAgainstCpu(c);
      }
    }
  }
}

TEST_CASE("simulated fast CUDA attention: long contexts, block size 1, head_dim 256",
          "[kernels][cuda_sim]") {
  struct {
    KvDtype dtype;
    int hd, bs, group;
    std::vector<int> ctx, q_len;
  } cases[] = {
      {KvDtype::kBf16, 128, 16, 4, {1000, 4097}, {1, 1}},
      {KvDtype::kInt8, 128, 16, 4, {4097, 33}, {1, 33}},
      {KvDtype::kInt4, 128, 32, 8, {1000}, {1}},
      {KvDtype::kK8V4, 64, 1, 4, {97, 18}, {3, 18}},
      {KvDtype::kFp16, 256, 16, 2, {130, 65}, {1, 65}},
      {KvDtype::kFp8E4m3, 256, 32, 1, {200}, {2}},
  };
  uint32_t seed = 100;
  for (const auto& cs : cases) {
    AttnCase c;
    c.dtype = cs.dtype;
    c.head_dim = cs.hd;
    c.block_size = cs.bs;
    c.group = cs.group;
    c.num_kv_heads = 1;
    c.int4_group = 64;
    c.ctx = cs.ctx;
    c.q_len = cs.q_len;
    c.seed = seed++;
    CheckAgainstCpu(c);
  }
}

TEST_CASE("simulated fast CUDA attention: bf16 and fp16 activations, peaky and huge scores",
          "[kernels][cuda_sim]") {
  for (ActDtype act : {ActDtype::kBf16, ActDtype::kFp16}) {
    AttnCase c;
    c.dtype = KvDtype::kK8V4;
    c.head_dim = 64;
    c.group = 4;
    c.ctx = {150, 9};
    c.q_len = {2, 9};
    c.q_scale = 4.0f;
    c.seed = 42;
    CheckAgainstCpu(c, act);
  }
  // Scores of hundreds: the online softmax and the warp merge must subtract
  // their maxima (exp overflows fp32 above about 88.7).
  AttnCase c;
  c.dtype = KvDtype::kBf16;
  c.head_dim = 64;
  c.group = 2;
  c.ctx = {300, 40};
  c.q_len = {1, 40};
  c.q_scale = 100.0f;
  c.seed = 43;
  CheckAgainstCpu(c);
}

TEST_CASE("simulated fast CUDA attention: sink queries agree with the reference kernel",
          "[kernels][cuda_sim]") {
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kInt8}) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 64;
    c.group = 4;
    c.ctx = {200, 20, 5};
    c.q_len = {1, 20, 1};
    c.window = 0;
    c.seed = 77;
    INFO(c.Name());
    const Problem p = Build(c);
    Run fast;
    fast.num_sinks = {4, 20, 70};  // some sinks, every key a sink, more sinks than keys
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    fast.sink_q.resize(p.q.size());
    for (float& x : fast.sink_q) x = ExactInHalfTypes(normal(rng));
    fast.options.fixed_partition_keys = 64;
    Run ref = fast;
    ref.fast = false;
    const double err = WorstError(p, RunSim(p, 0, fast), RunSim(p, 0, ref));
    INFO("worst error / max|v| = " << err);
    REQUIRE(err <= FastTolerance(dtype, ActDtype::kFp32));
    // The sinks matter: without them the output moves well past that.
    Run plain = ref;
    plain.num_sinks.clear();
    plain.sink_q.clear();
    REQUIRE(WorstError(p, RunSim(p, 0, plain), RunSim(p, 0, ref)) > 0.05);
  }
}

TEST_CASE("simulated CUDA attention: a grid narrower than the plan walks every item",
          "[kernels][cuda_sim]") {
  // A persistent grid (PagedAttentionParams::num_sms): 1 or 3 CTAs per head
  // chunk walk items x, x + grid, ...; each item's arithmetic is unchanged,
  // so the outputs are the same bits as with one CTA per item.
  AttnCase c;
  c.dtype = KvDtype::kInt8;
  c.head_dim = 64;
  c.group = 4;
  c.ctx = {300, 17, 97, 1, 40};
  c.q_len = {1, 17, 5, 1, 2};
  c.seed = 31;
  const Problem p = Build(c);
  for (bool fast : {true, false}) {
    Run wide;
    wide.fast = fast;
    wide.options.fixed_partition_keys = 64;
    const std::vector<float> want = RunSim(p, 0, wide);
    for (unsigned g : {1u, 3u}) {
      INFO((fast ? "fast" : "reference") << " grid " << g);
      Run narrow = wide;
      narrow.grid_x = g;
      REQUIRE(RunSim(p, 0, narrow) == want);
    }
  }
}

TEST_CASE("fast CUDA attention takes head_dim 64/128/256 and power-of-two blocks only",
          "[kernels][cuda_sim]") {
  for (int hd : {8, 16, 32, 64, 96, 128, 256}) {
    for (int bs : {1, 12, 16, 32}) {
      absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kBf16, 2, hd, bs, 32);
      REQUIRE(f.ok());
      const bool want = (hd == 64 || hd == 128 || hd == 256) && (bs == 1 || bs == 16 || bs == 32);
      INFO("hd " << hd << " bs " << bs);
      REQUIRE(attention_detail::MmaAttentionSupports(f->layout()) == want);
    }
  }
  for (int group : {2, 4, 8, 16, 64}) {  // int4 groups must hold whole 8-channel chunks
    absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kInt4, 2, 64, 16, group);
    REQUIRE(f.ok());
    INFO("int4 group " << group);
    // ... and be a power of two (shift addressing), as any group that
    // divides head_dim 64, 128 or 256 is: 8, 16 and 64 here.
    REQUIRE(attention_detail::MmaAttentionSupports(f->layout()) ==
            (group % 8 == 0 && attention_detail::IsPow2(group)));
  }
  for (KvDtype d : {KvDtype::kFp32, KvDtype::kInt4Kc}) {
    absl::StatusOr<KvFormat> f = KvFormat::Create(d, 2, 128, 16, 32);
    REQUIRE(f.ok());
    REQUIRE_FALSE(attention_detail::MmaAttentionSupports(f->layout()));
  }
}

}  // namespace
}  // namespace kvserve::cuda
