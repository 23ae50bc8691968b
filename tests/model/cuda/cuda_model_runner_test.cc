// [gpu] The CUDA model runner against the CPU backend on stories260K:
//   - fp32 weights and fp32 KV reproduce llama2.c's greedy text exactly,
//     with CUDA graphs and without;
//   - logits of prefill, decode and mixed batches match the CPU runner's;
//   - fp16, int8 and k8v4 KV give the CPU backend's first 100 greedy tokens;
//   - 64 concurrent greedy requests give the CPU backend's tokens;
//   - preemption (recompute and swap) on a pool of 64 blocks changes nothing;
//   - n = 4 forks and prefix caching share blocks exactly as on the CPU;
//   - device sampling, block copies and swaps, dummy weights generated on
//     the device, pool sizing, errors;
// and every engine test ends with every block back in the pool.
#include "model/cuda/cuda_model_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/cuda/host/device_weight_layout.h"
#include "model/loader/dummy_model.h"
#include "model/loader/model_loader.h"
#include "model/runner_factory.h"
#include "model/sampling/host_sampling.h"
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

struct Setup : testing::EngineSetup {
  std::string device = "cuda";  // or "cpu" for the reference
  std::string dtype = "fp32";
  KvDtype kv_dtype = KvDtype::kFp32;
  bool cuda_graphs = true;
};

RunnerOptions OptionsOf(const Setup& s) {
  RunnerOptions o = testing::RunnerOptionsOf(s);
  o.device = s.device;
  o.dtype = s.device == "cpu" ? "fp32" : s.dtype;
  o.cuda_graphs = s.cuda_graphs;
  o.kv_dtype = s.kv_dtype;
  return o;
}

std::unique_ptr<ModelRunner> MakeRunner(const Setup& s) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      CreateModelRunner(Stories().weights, OptionsOf(s));
  INFO(r.status().message());
  REQUIRE(r.ok());
  return std::move(*r);
}

// The engine and, for CUDA, its runner (owned by the engine).
struct TestEngine {
  std::unique_ptr<Engine> engine;
  CudaModelRunner* cuda = nullptr;
};

TestEngine MakeEngine(const Setup& s) {
  std::unique_ptr<ModelRunner> runner = MakeRunner(s);
  TestEngine t;
  t.cuda = dynamic_cast<CudaModelRunner*>(runner.get());
  if (s.device != "cpu") REQUIRE(t.cuda != nullptr);
  auto engine = Engine::Create(testing::EngineConfigOf(s), std::move(runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  t.engine = std::move(*engine);
  return t;
}

// Requests with random dev-set prompts, as the CPU engine tests make them.
std::vector<GenerateRequest> RandomGreedy(uint32_t seed, int count, size_t max_chars, int max_new,
                                          bool some_ignore_eos) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < count; ++i) {
    reqs.push_back(Greedy(RandomSnippet(rng, max_chars), 1 + rng() % max_new));
    reqs.back().ignore_eos = some_ignore_eos ? rng() % 4 == 0 : true;
  }
  return reqs;
}

// ---- Engine-level ------------------------------------------------------------

TEST_CASE("[gpu] stories260K with fp32 weights and KV reproduces the golden text", "[gpu]") {
  for (bool graphs : {true, false}) {
    DYNAMIC_SECTION("cuda graphs " << graphs) {
      Setup s;
      s.cuda_graphs = graphs;
      TestEngine t = MakeEngine(s);
      Result r = RunOne(*t.engine, Greedy("", 256));
      REQUIRE(r.text[0] == testing::GoldenGreedyText());
      REQUIRE(r.usage.completion_tokens == 256);
      // 256 steps of one row each (the BOS prompt has the shape of a decode
      // step too): all replay the bucket-1 graph, or all run eagerly.
      if (graphs) {
        REQUIRE(t.cuda->graph_buckets().front() == 1);
        REQUIRE(t.cuda->counters().graph_steps == 256);
        REQUIRE(t.cuda->counters().eager_steps == 0);
      } else {
        REQUIRE(t.cuda->graph_buckets().empty());
        REQUIRE(t.cuda->counters().graph_steps == 0);
        REQUIRE(t.cuda->counters().eager_steps == 256);
      }
      RequireAllBlocksFree(*t.engine);
    }
  }
}

TEST_CASE("[gpu] fp16, int8 and k8v4 KV give the CPU backend's first 100 greedy tokens", "[gpu]") {
  std::vector<GenerateRequest> reqs = RandomGreedy(77, 6, 200, 1, false);
  reqs.insert(reqs.begin(), Greedy("", 1));  // BOS alone
  for (GenerateRequest& r : reqs) {
    r.max_tokens = 100;
    r.ignore_eos = true;
  }
  for (KvDtype kv : {KvDtype::kFp16, KvDtype::kInt8, KvDtype::kK8V4}) {
    DYNAMIC_SECTION("kv " << KvDtypeName(kv)) {
      Setup gpu;
      gpu.kv_dtype = kv;
      Setup cpu = gpu;
      cpu.device = "cpu";
      TestEngine g = MakeEngine(gpu);
      TestEngine c = MakeEngine(cpu);
      std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
      std::vector<Result> on_cpu = RunConcurrently(*c.engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << ": '" << reqs[i].prompt << "'");
        REQUIRE(on_gpu[i].tokens[0].size() == 100);
        REQUIRE(on_gpu[i].tokens[0] == on_cpu[i].tokens[0]);
      }
      RequireAllBlocksFree(*g.engine);
    }
  }
}

TEST_CASE("[gpu] 64 concurrent greedy requests give the CPU backend's tokens", "[gpu]") {
  for (int block_size : {1, 16}) {
    DYNAMIC_SECTION("block_size " << block_size) {
      Setup gpu;
      gpu.block_size = block_size;
      gpu.num_blocks = 64 * 512 / block_size;
      gpu.max_num_batched_tokens = 256;  // long prompts are chunked
      Setup cpu = gpu;
      cpu.device = "cpu";
      const std::vector<GenerateRequest> reqs = RandomGreedy(1000 + block_size, 64, 400, 80, true);
      TestEngine g = MakeEngine(gpu);
      TestEngine c = MakeEngine(cpu);
      std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
      std::vector<Result> on_cpu = RunConcurrently(*c.engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << ": '" << reqs[i].prompt << "'");
        REQUIRE(on_gpu[i].tokens[0] == on_cpu[i].tokens[0]);
        REQUIRE(on_gpu[i].text[0] == on_cpu[i].text[0]);
        REQUIRE(on_gpu[i].finish[0] == on_cpu[i].finish[0]);
      }
      const EngineStats st = g.engine->GetStats();
      REQUIRE(st.preemptions == 0);
      REQUIRE(st.batched_seqs > 8 * st.steps);      // really batched
      REQUIRE(g.cuda->counters().graph_steps > 0);  // pure decode steps replayed graphs
      REQUIRE(g.cuda->counters().eager_steps > 0);  // prefill and mixed steps did not
      RequireAllBlocksFree(*g.engine);
    }
  }
}

TEST_CASE("[gpu] preemption by recompute and by swap on 64 blocks changes no token", "[gpu]") {
  const std::vector<GenerateRequest> reqs = [] {
    std::mt19937 rng(7);
    std::vector<GenerateRequest> out;
    for (int i = 0; i < 16; ++i) {
      out.push_back(Greedy(RandomSnippet(rng, 120), 40 + rng() % 100));
      out.back().ignore_eos = true;
      if (i % 5 == 4) out.back().priority = -1;
    }
    return out;
  }();
  Setup roomy;
  roomy.max_model_len = 192;
  roomy.max_num_seqs = 16;
  TestEngine reference = MakeEngine(roomy);
  const std::vector<Result> expected = RunConcurrently(*reference.engine, reqs);
  REQUIRE(reference.engine->GetStats().preemptions == 0);
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    DYNAMIC_SECTION((mode == PreemptionMode::kSwap ? "swap" : "recompute")) {
      Setup tight = roomy;
      tight.num_blocks = 64;  // 1024 tokens: about 6 of the 16 sequences
      tight.num_swap_blocks = mode == PreemptionMode::kSwap ? 72 : 0;
      tight.mode = mode;
      TestEngine t = MakeEngine(tight);
      std::vector<Result> got = RunConcurrently(*t.engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i);
        REQUIRE(got[i].finish[0] == FinishReason::kLength);
        REQUIRE(got[i].tokens[0] == expected[i].tokens[0]);
      }
      const EngineStats st = t.engine->GetStats();
      REQUIRE(st.preemptions > 0);
      if (mode == PreemptionMode::kSwap) {
        REQUIRE(st.kv.swapped_out_blocks > 0);
        REQUIRE(st.kv.swapped_in_blocks > 0);
      } else {
        REQUIRE(st.kv.swapped_out_blocks == 0);
      }
      RequireAllBlocksFree(*t.engine);
    }
  }
}

TEST_CASE("[gpu] n = 4 forks and prefix caching share blocks exactly as on the CPU", "[gpu]") {
  const GenerateRequest req = testing::ForkRequest();
  const std::vector<int32_t>& prompt = req.prompt_token_ids;  // 100 tokens

  SECTION("copy-on-write of the shared partial block, step by step") {
    Setup gpu;
    gpu.num_blocks = 512;
    gpu.max_num_batched_tokens = 16;  // a 7-step prefill: the callback is set in time
    gpu.max_num_seqs = 16;
    Setup cpu = gpu;
    cpu.device = "cpu";
    TestEngine g = MakeEngine(gpu);
    TestEngine c = MakeEngine(cpu);
    Result on_gpu, on_cpu;
    const std::vector<EngineStats> gs = testing::StatsPerEvent(*g.engine, req, &on_gpu);
    const std::vector<EngineStats> cs = testing::StatsPerEvent(*c.engine, req, &on_cpu);
    testing::RequireForkSharing(gs);
    // Block accounting is the cache manager's, whatever the backend.
    REQUIRE(gs.size() == cs.size());
    for (size_t i = 0; i < gs.size(); ++i) {
      INFO("event " << i);
      REQUIRE(gs[i].kv.num_active_blocks == cs[i].kv.num_active_blocks);
      REQUIRE(gs[i].kv.cow_copies == cs[i].kv.cow_copies);
    }
    // Sample i is the request with seed + i (the device draws from Philox,
    // so the tokens are the GPU's own, compared on the GPU).
    for (int i = 0; i < 4; ++i) {
      GenerateRequest one = req;
      one.n = 1;
      one.sampling.seed = 1234 + i;
      INFO("sample " << i);
      REQUIRE(RunOne(*g.engine, one).tokens[0] == on_gpu.tokens[i]);
    }
    RequireAllBlocksFree(*g.engine);
  }
  SECTION("greedy samples of a fork equal the CPU's, with logprobs") {
    GenerateRequest greedy = req;
    greedy.sampling = SamplingParams();
    greedy.sampling.temperature = 0;
    greedy.logprobs = 3;
    Setup gpu;
    Setup cpu = gpu;
    cpu.device = "cpu";
    TestEngine g = MakeEngine(gpu);
    TestEngine c = MakeEngine(cpu);
    Result on_gpu = RunOne(*g.engine, greedy);
    Result on_cpu = RunOne(*c.engine, greedy);
    for (int i = 0; i < 4; ++i) REQUIRE(on_gpu.tokens[i] == on_cpu.tokens[0]);
    RequireAllBlocksFree(*g.engine);
  }
  SECTION("a shared 100-token prefix is served from the cache, tokens unchanged") {
    const std::vector<GenerateRequest> reqs = testing::SharedPrefixRequests(prompt);
    Setup gpu;
    Setup cpu = gpu;
    cpu.device = "cpu";
    TestEngine g = MakeEngine(gpu);
    TestEngine c = MakeEngine(cpu);
    auto run = [&](Engine& e) {
      std::vector<Result> out;
      out.push_back(RunOne(e, reqs[0]));
      std::vector<GenerateRequest> rest(reqs.begin() + 1, reqs.end());
      for (Result& r : RunConcurrently(e, rest)) out.push_back(r);
      return out;
    };
    const std::vector<Result> on_gpu = run(*g.engine);
    const std::vector<Result> on_cpu = run(*c.engine);
    for (int i = 0; i < 16; ++i) {
      INFO("request " << i);
      REQUIRE(on_gpu[i].tokens[0] == on_cpu[i].tokens[0]);
      REQUIRE(on_gpu[i].usage.cached_prompt_tokens == (i == 0 ? 0 : 96));
    }
    REQUIRE(g.engine->GetStats().kv.prefix_hit_tokens == 15 * 96);
    RequireAllBlocksFree(*g.engine);
  }
}

// ---- Runner-level ------------------------------------------------------------

// Sequences as the tests drive them: token ids, block rows, cache lengths.
struct ManualSeq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int32_t cached = 0;
};

// `ids` repeated to `n` tokens: prompts long enough for the decode steps
// that follow them (logits are compared, so the tokens need not be sampled).
std::vector<int32_t> Cycled(std::vector<int32_t> ids, size_t n) {
  const size_t k = ids.size();
  for (size_t i = k; i < n; ++i) ids.push_back(ids[i % k]);
  return ids;
}

// A batch of `rows[i]` new tokens of each sequence (from its tokens), all
// wanting logits for their last row. Blocks are given by the caller.
BatchInput MakeBatch(std::vector<ManualSeq*> seqs, std::vector<int32_t> rows, int block_size) {
  BatchInput b;
  b.Clear();
  int32_t width = 0;
  for (ManualSeq* s : seqs)
    width = std::max<int32_t>(width, static_cast<int32_t>(s->blocks.size()));
  b.max_blocks_per_seq = width;
  for (size_t k = 0; k < seqs.size(); ++k) {
    ManualSeq& s = *seqs[k];
    for (int32_t i = s.cached; i < s.cached + rows[k]; ++i) {
      b.token_ids.push_back(s.tokens[i]);
      b.positions.push_back(i);
      b.slot_mapping.push_back(int64_t{s.blocks[i / block_size]} * block_size + i % block_size);
    }
    b.query_start.push_back(b.num_tokens());
    b.context_len.push_back(s.cached + rows[k]);
    std::vector<int32_t> row(width, 0);
    std::copy(s.blocks.begin(), s.blocks.end(), row.begin());
    b.block_table.insert(b.block_table.end(), row.begin(), row.end());
    b.logits_rows.push_back(b.num_tokens() - 1);
    s.cached += rows[k];
  }
  return b;
}

void RequireLogitsClose(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol) {
  REQUIRE(gpu.size() == cpu.size());
  double worst = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    REQUIRE(std::isfinite(gpu[i]));
    worst = std::max(worst, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  }
  INFO("largest |gpu - cpu| " << worst);
  REQUIRE(worst <= tol);
}

TEST_CASE("[gpu] logits of prefill, decode and mixed batches match the CPU runner's", "[gpu]") {
  // fp32: summation order only (observed differences are ~1e-6 of logits of
  // magnitude ~10); bf16 weights and activations: a few bf16 roundings per
  // layer, so only a loose bound (the greedy agreement is what matters).
  for (const char* dtype : {"fp32", "bf16"}) {
    DYNAMIC_SECTION("model.dtype " << dtype) {
      Setup gpu;
      gpu.dtype = dtype;
      gpu.num_blocks = 32;
      gpu.max_num_seqs = 8;
      Setup cpu = gpu;
      cpu.device = "cpu";
      std::unique_ptr<ModelRunner> g = MakeRunner(gpu);
      std::unique_ptr<ModelRunner> c = MakeRunner(cpu);
      const double tol = std::string(dtype) == "fp32" ? 2e-3 : 1.0;
      const Tokenizer& tok = *Stories().tokenizer;
      ManualSeq a{
          Cycled(tok.Encode("Once upon a time, there was a little girl named Lily.", true), 32),
          {0, 1}};
      ManualSeq b{Cycled(tok.Encode("The dog ran", true), 16), {2}};
      ManualSeq d{Cycled(tok.Encode("Tom and Sue went to the park to play with a ball.", true), 32),
                  {3, 4}};
      ManualSeq a2 = a, b2 = b, d2 = d;  // the CPU's copies
      auto step = [&](std::vector<ManualSeq*> gs, std::vector<ManualSeq*> cs,
                      std::vector<int32_t> rows) {
        BatchInput bg = MakeBatch(gs, rows, 16);
        BatchInput bc = MakeBatch(cs, rows, 16);
        std::vector<float> lg(bg.logits_rows.size() * 512), lc(lg.size());
        absl::Status sg = g->Forward(bg, lg);
        INFO(sg.message());
        REQUIRE(sg.ok());
        REQUIRE(c->Forward(bc, lc).ok());
        RequireLogitsClose(lg, lc, tol);
      };
      step({&a, &b}, {&a2, &b2}, {10, 3});             // two prefills
      step({&a, &b}, {&a2, &b2}, {1, 1});              // decode
      step({&a, &b, &d}, {&a2, &b2, &d2}, {1, 1, 9});  // mixed: decodes + a prefill chunk
      step({&d, &a}, {&d2, &a2}, {6, 1});              // more of d, one more of a
      for (int i = 0; i < 3; ++i) step({&a, &b, &d}, {&a2, &b2, &d2}, {1, 1, 1});
    }
  }
}

TEST_CASE("[gpu] device sampling: greedy, logprobs, seeded draws, shared logits rows", "[gpu]") {
  Setup s;
  s.num_blocks = 16;
  s.max_num_seqs = 8;
  s.max_model_len = 256;  // one sequence must fit the pool (kv_pool_plan.h)
  std::unique_ptr<ModelRunner> r = MakeRunner(s);
  const Tokenizer& tok = *Stories().tokenizer;
  ManualSeq a{tok.Encode("Once upon a time", true), {0}};
  ManualSeq b{tok.Encode("Lily saw a bird", true), {1}};
  BatchInput batch = MakeBatch(
      {&a, &b}, {static_cast<int32_t>(a.tokens.size()), static_cast<int32_t>(b.tokens.size())}, 16);
  REQUIRE(r->Forward(batch).ok());
  std::vector<float> logits(2 * 512);
  REQUIRE(r->ReadLogits(logits).ok());

  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams random;
  random.temperature = 0.8f;
  random.top_p = 0.9f;
  std::vector<SampleRow> rows(6);
  for (int i = 0; i < 6; ++i) rows[i].params = i < 2 ? &greedy : &random;
  rows[0].logits_index = 0;
  rows[0].num_logprobs = 5;
  rows[1].logits_index = 1;
  rows[2].logits_index = 1;  // rows 2 and 3: one logits row, one seed: one token
  rows[2].seed = 99;
  rows[3].logits_index = 1;
  rows[3].seed = 99;
  rows[4].logits_index = 0;
  rows[4].seed = 99;
  rows[5].logits_index = 0;
  rows[5].seed = 99;
  std::vector<SampledToken> out(6);
  REQUIRE(r->Sample(rows, out).ok());

  // Greedy is the CPU sampler's token, logprobs within float rounding.
  std::vector<SampledToken> ref(2);
  std::vector<SampleRow> ref_rows(rows.begin(), rows.begin() + 2);
  HostRowSampler host;
  REQUIRE(host.Sample(logits, 512, ref_rows, ref).ok());
  REQUIRE(out[0].token == ref[0].token);
  REQUIRE(out[1].token == ref[1].token);
  REQUIRE(out[0].logprob == Approx(ref[0].logprob).margin(1e-5));
  REQUIRE(out[0].top.size() == 5);
  for (int k = 0; k < 5; ++k) {
    REQUIRE(out[0].top[k].first == ref[0].top[k].first);
    REQUIRE(out[0].top[k].second == Approx(ref[0].top[k].second).margin(1e-5));
  }
  REQUIRE(out[1].top.empty());
  REQUIRE(out[2].token == out[3].token);
  REQUIRE(out[4].token == out[5].token);

  SECTION("the draw is a function of seed and step only") {
    std::vector<SampledToken> again(6);
    REQUIRE(r->Sample(rows, again).ok());
    for (int i = 0; i < 6; ++i) REQUIRE(again[i].token == out[i].token);
  }
  SECTION("rows past the last batch's logits are refused") {
    rows[0].logits_index = 2;
    REQUIRE(r->Sample(rows, out).code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("[gpu] CopyBlocks, SwapOut and SwapIn move whole blocks of every layer", "[gpu]") {
  for (KvDtype kv : {KvDtype::kFp32, KvDtype::kInt8, KvDtype::kInt4}) {
    DYNAMIC_SECTION("kv " << KvDtypeName(kv)) {
      Setup s;
      s.kv_dtype = kv;
      s.num_blocks = 16;
      s.num_swap_blocks = 8;
      s.max_num_seqs = 4;
      s.max_model_len = 256;
      std::unique_ptr<ModelRunner> r = MakeRunner(s);
      auto* cuda = dynamic_cast<CudaModelRunner*>(r.get());
      REQUIRE(cuda != nullptr);
      const Tokenizer& tok = *Stories().tokenizer;
      ManualSeq a{tok.Encode("Once upon a time, there was a little girl named Lily. She", true),
                  {0, 1}};
      REQUIRE(a.tokens.size() >= 17);
      BatchInput batch = MakeBatch({&a}, {17}, 16);
      REQUIRE(r->Forward(batch).ok());
      auto block = [&](int layer, int32_t id) {
        absl::StatusOr<std::vector<uint8_t>> bytes = cuda->ReadBlock(layer, id);
        REQUIRE(bytes.ok());
        return *bytes;
      };
      std::vector<std::vector<uint8_t>> original;
      for (int l = 0; l < 5; ++l) original.push_back(block(l, 0));
      const BlockCopy cow[] = {{0, 10}, {1, 11}};
      REQUIRE(r->CopyBlocks(cow).ok());
      for (int l = 0; l < 5; ++l) REQUIRE(block(l, 10) == original[l]);
      const BlockCopy out[] = {{0, 5}};
      REQUIRE(r->SwapOut(out).ok());
      ManualSeq other{tok.Encode("The dog ran to the big tree and barked", true), {0}};
      BatchInput clobber = MakeBatch({&other}, {static_cast<int32_t>(other.tokens.size())}, 16);
      REQUIRE(r->Forward(clobber).ok());
      REQUIRE(block(0, 0) != original[0]);
      const BlockCopy in[] = {{5, 12}};
      REQUIRE(r->SwapIn(in).ok());
      for (int l = 0; l < 5; ++l) REQUIRE(block(l, 12) == original[l]);
      REQUIRE(cuda->Synchronize().ok());
    }
  }
}

TEST_CASE("[gpu] dummy weights generated on the device equal the host loader's", "[gpu]") {
  absl::StatusOr<LlamaWeights> host = LoadDummyModel("tiny", uint64_t{1} << 30);
  absl::StatusOr<LlamaWeights> shapes = LoadDummyModelShapes("tiny");
  REQUIRE(host.ok());
  REQUIRE(shapes.ok());
  Setup s;
  s.num_blocks = 8;
  s.max_num_seqs = 4;
  s.max_model_len = 128;
  RunnerOptions o = OptionsOf(s);
  absl::StatusOr<std::unique_ptr<ModelRunner>> uploaded = CreateModelRunner(*host, o);
  absl::StatusOr<std::unique_ptr<ModelRunner>> generated = CreateModelRunner(*shapes, o);
  REQUIRE(uploaded.ok());
  REQUIRE(generated.ok());
  ManualSeq a{{1, 5, 9, 300, 7}, {0}};
  ManualSeq b = a;
  BatchInput ba = MakeBatch({&a}, {5}, 16);
  BatchInput bb = MakeBatch({&b}, {5}, 16);
  std::vector<float> la(512), lb(512);
  REQUIRE((*uploaded)->Forward(ba, la).ok());
  REQUIRE((*generated)->Forward(bb, lb).ok());
  REQUIRE(std::memcmp(la.data(), lb.data(), la.size() * 4) == 0);
}

TEST_CASE("[gpu] the KV pool is sized after the weights and a measured activation peak", "[gpu]") {
  Setup s;
  s.num_blocks = 0;
  RunnerOptions o = OptionsOf(s);
  o.memory_fraction = 0.01;
  absl::StatusOr<std::unique_ptr<ModelRunner>> small = CreateModelRunner(Stories().weights, o);
  INFO(small.status().message());
  REQUIRE(small.ok());
  const RunnerMemoryInfo& m = (*small)->memory_info();
  size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  REQUIRE(m.pool_sized_from == "cache.memory_fraction");
  REQUIRE(m.weight_bytes == PlanDeviceWeights(Stories().weights.config, 4).total_bytes);
  REQUIRE(m.activation_bytes > 0);
  REQUIRE(m.kv_bytes_per_block == (*small)->kv_format().block_bytes() * 5);
  REQUIRE(m.kv_pool_bytes == int64_t{m.num_blocks} * m.kv_bytes_per_block);
  REQUIRE(m.kv_pool_tokens == int64_t{m.num_blocks} * 16);
  REQUIRE(m.kv_pool_bytes <= static_cast<int64_t>(0.01 * static_cast<double>(total)));
  REQUIRE(m.kv_pool_bytes > static_cast<int64_t>(0.005 * static_cast<double>(free_bytes)));
  REQUIRE(m.device.rfind("cuda:0 (", 0) == 0);
  REQUIRE(m.weight_dtype == "fp32");

  SECTION("an explicit pool that does not fit names the key") {
    RunnerOptions huge = o;
    huge.num_blocks = 2000000000;
    absl::StatusOr<std::unique_ptr<ModelRunner>> r2 = CreateModelRunner(Stories().weights, huge);
    REQUIRE(r2.status().code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(std::string(r2.status().message()).rfind("cache.num_blocks: ", 0) == 0);
  }
  SECTION("a device that does not exist names model.device") {
    RunnerOptions far = o;
    far.device = "cuda:99";
    absl::StatusOr<std::unique_ptr<ModelRunner>> r3 = CreateModelRunner(Stories().weights, far);
    REQUIRE(
        std::string(r3.status().message()).rfind("model.device: cuda:99: this machine has ", 0) ==
        0);
  }
}

TEST_CASE("[gpu] a malformed batch is refused before anything runs", "[gpu]") {
  Setup s;
  s.num_blocks = 4;
  s.max_num_seqs = 2;
  s.max_num_batched_tokens = 32;
  s.max_model_len = 64;
  std::unique_ptr<ModelRunner> r = MakeRunner(s);
  ManualSeq a{{1, 5, 600}, {0}};
  BatchInput bad = MakeBatch({&a}, {3}, 16);
  std::vector<float> logits(512);
  absl::Status st = r->Forward(bad, logits);
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(st.message()).find("token_ids[2]") != std::string::npos);
  ManualSeq big{std::vector<int32_t>(40, 5), {0, 1, 2}};
  BatchInput too_many = MakeBatch({&big}, {40}, 16);
  st = r->Forward(too_many, logits);
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(st.message()).find("scheduler.max_num_batched_tokens") != std::string::npos);
  // The runner serves on.
  ManualSeq ok{{1, 5, 9}, {0}};
  BatchInput good = MakeBatch({&ok}, {3}, 16);
  REQUIRE(r->Forward(good, logits).ok());
}

TEST_CASE("[gpu] a few small steps with graphs, sampling and copies", "[gpu][sanitize]") {
  Setup s;
  s.num_blocks = 8;
  s.num_swap_blocks = 2;
  s.max_num_seqs = 2;
  s.max_num_batched_tokens = 16;
  s.max_model_len = 64;
  std::unique_ptr<ModelRunner> r = MakeRunner(s);
  ManualSeq a{{1, 5, 9, 300, 7, 8, 9, 10}, {0}};
  ManualSeq b{{1, 400, 3, 4, 5, 6}, {1}};
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<SampleRow> rows(2);
  rows[0].params = &greedy;
  rows[1].params = &greedy;
  rows[1].logits_index = 1;
  std::vector<SampledToken> out(2);
  REQUIRE(r->Forward(MakeBatch({&a, &b}, {5, 3}, 16)).ok());
  REQUIRE(r->Sample(rows, out).ok());
  for (int i = 0; i < 3; ++i) {
    REQUIRE(r->Forward(MakeBatch({&a, &b}, {1, 1}, 16)).ok());  // a graph replay
    REQUIRE(r->Sample(rows, out).ok());
  }
  const BlockCopy copy[] = {{0, 3}};
  REQUIRE(r->CopyBlocks(copy).ok());
  const BlockCopy swap_out[] = {{0, 1}};
  REQUIRE(r->SwapOut(swap_out).ok());
  const BlockCopy swap_in[] = {{1, 4}};
  REQUIRE(r->SwapIn(swap_in).ok());
  REQUIRE(dynamic_cast<CudaModelRunner*>(r.get())->Synchronize().ok());
}

}  // namespace
}  // namespace kvserve
