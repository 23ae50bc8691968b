// Engines for the CUDA runner tests through the stand-in: the CUDA runner on
// stories260K with small limits (4 sequences, 32 batched tokens, 48 blocks,
// so that its start-up profile forward is small), and the references it is
// held to: the CPU runner, or the CPU forward with fp16 int4_kc tails
// (tests/model/cuda/fp16_tail_cpu_runner.h).
#pragma once

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>

#include "cache/eviction/learned_evictor.h"
#include "cache/format/kv_dtype_spec.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/runner_factory.h"
#include "scheduler/engine.h"
#include "tests/engine_harness.h"
#include "tests/model/cuda/fp16_tail_cpu_runner.h"
#include "tests/test_util.h"

namespace kvserve::testing {

struct StubSetup : EngineSetup {
  StubSetup() {
    num_blocks = 48;
    max_num_seqs = 4;
    max_num_batched_tokens = 32;
  }
  // "cuda", "cpu" (the CPU runner) or "cpu_fp16_tails" (the CPU forward
  // with the CUDA runner's fp16 int4_kc tails).
  std::string device = "cuda";
  std::string kv_dtype = "fp32";
  std::string dtype = "fp32";         // model.dtype of the CUDA runner
  std::string weight_dtype = "auto";  // model.weight_dtype
  bool cuda_graphs = true;
  bool eviction = false;  // the engine gets the learned policy's model file
};

struct StubEngine {
  std::unique_ptr<Engine> engine;
  CudaModelRunner* cuda = nullptr;
};

// A small learned-evictor model (its weights favour accumulated attention
// and sinks), written once per test binary.
inline const std::string& StubEvictorFile() {
  static const std::string* path = [] {
    EvictorModel m;
    m.horizon = 8;
    m.mean.fill(0.0f);
    m.scale.fill(1.0f);
    m.weights = {1.0f, 0.5f, 0.3f, -0.2f, -0.5f, 2.0f, 0.0f};
    m.bias = 0.1f;
    auto* p = new std::string(MakeTempDir("stub_evictor") + "/evictor.txt");
    std::ofstream(*p) << m.Serialize();
    return p;
  }();
  return *path;
}

// The runner options of a "cuda" or "cpu" setup (RunnerOptionsOf, plus
// the device, dtypes and graphs).
inline RunnerOptions StubRunnerOptions(const StubSetup& s) {
  RunnerOptions o = RunnerOptionsOf(s);
  o.device = s.device;
  o.dtype = s.device == "cuda" ? s.dtype : "fp32";
  if (s.device == "cuda") o.weight_dtype = s.weight_dtype;
  o.kv_dtype = *KvDtypeSpec::Parse(s.kv_dtype);
  o.cuda_graphs = s.cuda_graphs;
  return o;
}

inline std::unique_ptr<ModelRunner> MakeStubRunner(const StubSetup& s) {
  RunnerOptions o = RunnerOptionsOf(s);
  const KvDtypeSpec spec = *KvDtypeSpec::Parse(s.kv_dtype);
  if (s.device == "cpu_fp16_tails") {
    // The CUDA runner's tail pools: 2 tails per sequence slot, and as many
    // swap tails when there is a swap pool.
    const int32_t tails = 2 * s.max_num_seqs;
    auto r = Fp16TailCpuRunner::Create(Stories().weights, spec, s.block_size, o.int4_group_size,
                                       s.num_blocks, s.num_swap_blocks, tails,
                                       s.num_swap_blocks > 0 ? tails : 0);
    INFO(r.status().message());
    REQUIRE(r.ok());
    return std::move(*r);
  }
  o = StubRunnerOptions(s);
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories().weights, o);
  INFO(r.status().message());
  REQUIRE(r.ok());
  if (s.device == "cuda") REQUIRE(dynamic_cast<CudaModelRunner*>(r->get()) != nullptr);
  return std::move(*r);
}

inline StubEngine MakeStubEngine(const StubSetup& s) {
  std::unique_ptr<ModelRunner> runner = MakeStubRunner(s);
  StubEngine t;
  t.cuda = dynamic_cast<CudaModelRunner*>(runner.get());
  EngineConfig config = EngineConfigOf(s);
  if (s.eviction) config.evictor_model = StubEvictorFile();
  auto engine = Engine::Create(config, std::move(runner), Stories().tokenizer);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  t.engine = std::move(*engine);
  return t;
}

}  // namespace kvserve::testing
