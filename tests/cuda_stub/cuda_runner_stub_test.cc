// The CUDA model runner on stories260K through the CUDA stand-in (every
// kernel run on the CPU by cuda_sim), with small limits (4 sequences, 32
// batched tokens, 48 blocks) so that its start-up profile forward is small:
//   - fp32 weights and fp32 KV reproduce llama2.c's greedy text exactly,
//     with CUDA graphs (every step replays the bucket-1 graph) and without;
//   - int8 KV gives the CPU runner's greedy tokens for a few prompts run
//     together (prefill eager, decode from graphs);
// and every engine test ends with every block back in the pool.
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_dtype_spec.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/runner_factory.h"
#include "scheduler/engine.h"
#include "tests/engine_harness.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Greedy;
using testing::RandomSnippet;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunConcurrently;
using testing::RunOne;
using testing::Stories;

struct StubSetup : testing::EngineSetup {
  StubSetup() {
    num_blocks = 48;
    max_num_seqs = 4;
    max_num_batched_tokens = 32;
  }
  std::string device = "cuda";
  std::string kv_dtype = "fp32";
  bool cuda_graphs = true;
};

struct StubEngine {
  std::unique_ptr<Engine> engine;
  CudaModelRunner* cuda = nullptr;
};

StubEngine MakeEngine(const StubSetup& s) {
  RunnerOptions o = testing::RunnerOptionsOf(s);
  o.device = s.device;
  o.dtype = "fp32";
  o.kv_dtype = *KvDtypeSpec::Parse(s.kv_dtype);
  o.cuda_graphs = s.cuda_graphs;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateModelRunner(Stories().weights, o);
  INFO(runner.status().message());
  REQUIRE(runner.ok());
  StubEngine t;
  t.cuda = dynamic_cast<CudaModelRunner*>(runner->get());
  if (s.device != "cpu") REQUIRE(t.cuda != nullptr);
  auto engine = Engine::Create(testing::EngineConfigOf(s), std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  t.engine = std::move(*engine);
  return t;
}

TEST_CASE("stub runner: fp32 weights and KV reproduce the golden text", "[cuda_stub]") {
  for (bool graphs : {true, false}) {
    DYNAMIC_SECTION("cuda graphs " << graphs) {
      StubSetup s;
      s.cuda_graphs = graphs;
      StubEngine t = MakeEngine(s);
      Result r = RunOne(*t.engine, Greedy("", 256));
      REQUIRE(r.text[0] == testing::GoldenGreedyText());
      REQUIRE(r.usage.completion_tokens == 256);
      if (graphs) {
        REQUIRE(t.cuda->graph_buckets().front() == 1);
        REQUIRE(t.cuda->counters().graph_steps == 256);
        REQUIRE(t.cuda->counters().eager_steps == 0);
      } else {
        REQUIRE(t.cuda->graph_buckets().empty());
        REQUIRE(t.cuda->counters().eager_steps == 256);
      }
      RequireAllBlocksFree(*t.engine);
    }
  }
}

TEST_CASE("stub runner: int8 KV gives the CPU runner's greedy tokens", "[cuda_stub]") {
  std::mt19937 rng(23);
  std::vector<GenerateRequest> reqs;
  reqs.push_back(Greedy("", 40));  // BOS alone
  for (int i = 0; i < 3; ++i) reqs.push_back(Greedy(RandomSnippet(rng, 120), 40));
  for (GenerateRequest& r : reqs) r.ignore_eos = true;
  for (const char* spec : {"int8"}) {
    DYNAMIC_SECTION("kv " << spec) {
      StubSetup gpu;
      gpu.kv_dtype = spec;
      StubSetup cpu = gpu;
      cpu.device = "cpu";
      StubEngine g = MakeEngine(gpu);
      StubEngine c = MakeEngine(cpu);
      std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
      std::vector<Result> on_cpu = RunConcurrently(*c.engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << ": '" << reqs[i].prompt << "'");
        REQUIRE(on_gpu[i].tokens[0].size() == 40);
        REQUIRE(on_gpu[i].tokens[0] == on_cpu[i].tokens[0]);
      }
      REQUIRE(g.cuda->counters().graph_steps > 0);
      REQUIRE(g.cuda->counters().eager_steps > 0);
      RequireAllBlocksFree(*g.engine);
    }
  }
}

}  // namespace
}  // namespace kvserve
