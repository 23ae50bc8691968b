// [gpu] int4_kc KV (per-channel K over full blocks, fp16 tails for partial
// blocks) and a per-layer list with int4_kc layers on the CUDA runner,
// against the CPU runner on stories260K:
//   - for "int4_kc" and "int8,int4_kc*,int8", each of the engine's first
//     100 greedy tokens is the greedy choice, or a near tie, of the CPU
//     forward with fp16 tails given the same history (decode steps replayed
//     from graphs, prefill and mixed steps eager);
//   - preemption by swap on a tight pool (blocks and tails swapped out and
//     back in) changes no token;
//   - every engine test ends with every block back in the pool.
// The CPU runner keeps tails in fp32, the CUDA runner in fp16, a different
// function (fp16_tail_cpu_runner.h), so the reference is the CPU forward
// with fp16 tails; and 4-bit levels turn the GEMMs' one-ulp differences
// into whole-level changes now and then, so no backend reproduces
// another's 4-bit greedy tokens exactly (tests/cuda_stub/
// cuda_runner_stub_test.cc measures it): the assertion is teacher-forced
// (teacher_forced.h), near ties within kNearTie, at most a tenth of them.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/format/kv_dtype_spec.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/runner_factory.h"
#include "scheduler/engine.h"
#include "tests/engine_harness.h"
#include "tests/model/cuda/fp16_tail_cpu_runner.h"
#include "tests/model/cuda/teacher_forced.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Greedy;
using testing::RandomSnippet;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunConcurrently;
using testing::Stories;

struct KcSetup : testing::EngineSetup {
  std::string device = "cuda";
  std::string kv_dtype = "int4_kc";
};

struct KcEngine {
  std::unique_ptr<Engine> engine;
  CudaModelRunner* cuda = nullptr;
  int32_t num_tails = 0;
  int32_t num_swap_tails = 0;
};

KcEngine MakeKcEngine(const KcSetup& s) {
  RunnerOptions o = testing::RunnerOptionsOf(s);
  o.device = s.device;
  o.dtype = "fp32";
  o.kv_dtype = *KvDtypeSpec::Parse(s.kv_dtype);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateModelRunner(Stories().weights, o);
  INFO(runner.status().message());
  REQUIRE(runner.ok());
  KcEngine t;
  t.cuda = dynamic_cast<CudaModelRunner*>(runner->get());
  if (s.device != "cpu") REQUIRE(t.cuda != nullptr);
  t.num_tails = (*runner)->num_tail_blocks();
  t.num_swap_tails = (*runner)->num_swap_tail_blocks();
  auto engine = Engine::Create(testing::EngineConfigOf(s), std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  t.engine = std::move(*engine);
  return t;
}

constexpr float kNearTie = 0.5f;
// int2_kc's level is 5 times int4's (a range over 3 steps, not 15), so a
// flipped code moves a logit 5 times as far: an H200 picked a token 1.65
// below the fp16-tail CPU's best at one position, past 0.5.
constexpr float kNearTieInt2 = 5 * kNearTie;

TEST_CASE("[gpu] int4_kc and int8,int4_kc*,int8 KV pick the fp16-tail CPU's greedy tokens",
          "[gpu]") {
  std::mt19937 rng(4242);
  std::vector<GenerateRequest> reqs;
  reqs.push_back(Greedy("", 100));  // BOS alone: every block sealed from decode steps
  for (int i = 0; i < 12; ++i) reqs.push_back(Greedy(RandomSnippet(rng, 300), 100));
  for (GenerateRequest& r : reqs) r.ignore_eos = true;
  for (const char* spec : {"int4_kc", "int8,int4_kc*,int8", "int2_kc"}) {
    DYNAMIC_SECTION("kv " << spec) {
      KcSetup gpu;
      gpu.kv_dtype = spec;
      gpu.max_num_batched_tokens = 96;  // long prompts are chunked across block boundaries
      KcEngine g = MakeKcEngine(gpu);
      REQUIRE(g.num_tails == 2 * gpu.max_num_seqs);
      REQUIRE(g.num_swap_tails == 0);  // no swap pool
      const std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
      int ties = 0, steps = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << ": '" << reqs[i].prompt << "'");
        REQUIRE(on_gpu[i].tokens[0].size() == 100);
        auto ref = testing::Fp16TailCpuRunner::Create(Stories().weights, *KvDtypeSpec::Parse(spec),
                                                      16, 64, 64, 0, 1, 0);
        REQUIRE(ref.ok());
        const std::vector<int32_t> prompt = Stories().tokenizer->Encode(reqs[i].prompt, true);
        const float near_tie = std::string(spec) == "int2_kc" ? kNearTieInt2 : kNearTie;
        ties += testing::RequireNearGreedy(**ref, prompt, on_gpu[i].tokens[0], near_tie, 96);
        steps += 100;
      }
      INFO(ties << " of " << steps << " tokens are near ties");
      REQUIRE(ties * 10 <= steps);
      REQUIRE(g.cuda->counters().graph_steps > 0);
      REQUIRE(g.cuda->counters().eager_steps > 0);
      RequireAllBlocksFree(*g.engine);
    }
  }
}

TEST_CASE("[gpu] int4_kc: preemption by swap (blocks and tails) changes no token", "[gpu]") {
  const std::vector<GenerateRequest> reqs = [] {
    std::mt19937 rng(11);
    std::vector<GenerateRequest> out;
    for (int i = 0; i < 16; ++i) {
      out.push_back(Greedy(RandomSnippet(rng, 120), 40 + rng() % 100));
      out.back().ignore_eos = true;
      if (i % 5 == 4) out.back().priority = -1;
    }
    return out;
  }();
  for (const char* spec : {"int4_kc", "int8,int4_kc*,int8", "int2_kc"}) {
    DYNAMIC_SECTION("kv " << spec) {
      KcSetup roomy;
      roomy.kv_dtype = spec;
      roomy.max_model_len = 192;
      roomy.max_num_seqs = 16;
      KcEngine reference = MakeKcEngine(roomy);
      const std::vector<Result> expected = RunConcurrently(*reference.engine, reqs);
      REQUIRE(reference.engine->GetStats().preemptions == 0);

      KcSetup tight = roomy;
      tight.num_blocks = 64;  // 1024 tokens: about 6 of the 16 sequences
      tight.num_swap_blocks = 72;
      tight.mode = PreemptionMode::kSwap;
      KcEngine t = MakeKcEngine(tight);
      REQUIRE(t.num_swap_tails == t.num_tails);
      const std::vector<Result> got = RunConcurrently(*t.engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i);
        REQUIRE(got[i].finish[0] == FinishReason::kLength);
        REQUIRE(got[i].tokens[0] == expected[i].tokens[0]);
      }
      const EngineStats st = t.engine->GetStats();
      REQUIRE(st.preemptions > 0);
      REQUIRE(st.kv.swapped_out_blocks > 0);
      REQUIRE(st.kv.swapped_in_blocks > 0);
      RequireAllBlocksFree(*t.engine);
      RequireAllBlocksFree(*reference.engine);
    }
  }
}

}  // namespace
}  // namespace kvserve
