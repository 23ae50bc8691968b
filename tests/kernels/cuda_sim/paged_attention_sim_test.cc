// The CUDA paged-attention kernels' source, run on the CPU by cuda_sim.h
// (fibers for threads, exact barriers and shuffles, NaN-poisoned shared
// memory), against cpu::PagedAttention on the same pages: the device code's
// indexing, masking, online softmax, split-KV partials and merge are checked
// in make test on machines without a GPU. Small cases only (the simulation
// is slow); the [gpu] tests run the full sweep on a device. Same problems,
// poisoning and tolerances as tests/kernels/cuda/attention/paged_attention_test.cc.
//
// The launch arguments are built here as paged_attention.cu builds them
// (that file's validation is covered by the [gpu] tests).
// clang-format off
#include "tests/kernels/cuda_sim/attention_sim_run.h"  // first: the simulator and the kernels
// clang-format on

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/attention_problem.h"

namespace kvserve::cuda {
namespace {

using namespace ::kvserve::cuda::testing;  // NOLINT: the shared problem helpers
// The reference kernel (SimRun's default).
using SimSetup = SimRun;

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
