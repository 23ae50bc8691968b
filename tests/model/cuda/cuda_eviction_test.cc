// [gpu] KV eviction on the CUDA runner against the CPU runner, stories260K:
//   - runner level: sink queries, recorded attention statistics and
//     positions past the 512-entry RoPE table give the CPU runner's logits
//     and statistics; MoveSlots moves exactly one token's K/V bytes (with
//     scales) in every layer, and the next step's logits still match;
//   - engine level: every eviction policy (streaming with and without
//     sinks, H2O, Scissorhands, sliding_window), mixed in one batch, gives
//     the CPU engine's greedy tokens for fp32 KV and for fp16 / int8 / k8v4,
//     with CUDA graphs on (eviction steps run eagerly), streaming past the
//     model's 512 positions included; every block is free afterwards.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/cpu/cpu_model_runner.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/loader/model_loader.h"
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

struct Setup : testing::EngineSetup {
  std::string device = "cuda";
  KvDtype kv_dtype = KvDtype::kFp32;
  bool cuda_graphs = true;
};

std::unique_ptr<ModelRunner> MakeRunner(const Setup& s) {
  RunnerOptions o = testing::RunnerOptionsOf(s);
  o.device = s.device;
  o.dtype = "fp32";
  o.cuda_graphs = s.cuda_graphs;
  o.kv_dtype = s.kv_dtype;
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories().weights, o);
  INFO(r.status().message());
  REQUIRE(r.ok());
  REQUIRE((*r)->supports_eviction());
  return std::move(*r);
}

std::unique_ptr<Engine> MakeEngine(const Setup& s) {
  auto engine = Engine::Create(testing::EngineConfigOf(s), MakeRunner(s), Stories().tokenizer);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  return std::move(*engine);
}

KvPolicyOverride Policy(const char* name, int32_t budget, int32_t sinks = -1) {
  KvPolicyOverride p;
  p.policy = name;
  p.budget = budget;
  p.sink_tokens = sinks;
  return p;
}

// ---- Runner level ----------------------------------------------------------

// One step of `rows` new tokens per sequence (token ids cycled from `ids`),
// sequence k at cache indices cached[k].. and RoPE positions shifted by
// shift[k] (as an evicting sequence's are), blocks {2k, 2k + 1} of 16.
BatchInput Step(const std::vector<int32_t>& ids, std::vector<int32_t>& cached,
                const std::vector<int32_t>& rows, const std::vector<int32_t>& shift,
                const std::vector<int32_t>& sinks, const std::vector<uint8_t>& stats) {
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = 2;
  for (size_t k = 0; k < rows.size(); ++k) {
    const int32_t blocks[2] = {static_cast<int32_t>(2 * k), static_cast<int32_t>(2 * k + 1)};
    for (int32_t i = cached[k]; i < cached[k] + rows[k]; ++i) {
      b.token_ids.push_back(ids[(i + 7 * k) % ids.size()]);
      b.positions.push_back(i + shift[k]);
      b.slot_mapping.push_back(int64_t{blocks[i / 16]} * 16 + i % 16);
    }
    b.query_start.push_back(b.num_tokens());
    cached[k] += rows[k];
    b.context_len.push_back(cached[k]);
    b.block_table.insert(b.block_table.end(), blocks, blocks + 2);
    b.logits_rows.push_back(b.num_tokens() - 1);
  }
  b.num_sinks = sinks;
  b.attention_stats = stats;
  return b;
}

int64_t StatsFloats(const BatchInput& b, int layers) {
  int64_t n = 0;
  for (int32_t k = 0; k < b.num_seqs(); ++k) {
    if (!b.attention_stats.empty() && b.attention_stats[k] != 0)
      n += int64_t{layers} * b.context_len[k];
  }
  return n;
}

void RequireClose(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
                  const char* what) {
  REQUIRE(gpu.size() == cpu.size());
  double worst = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    REQUIRE(std::isfinite(gpu[i]));
    worst = std::max(worst, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  }
  INFO(what << ": largest |gpu - cpu| " << worst);
  REQUIRE(worst <= tol);
}

TEST_CASE(
    "[gpu] sinks, attention statistics, positions past the table and slot moves match "
    "the CPU runner",
    "[gpu][eviction]") {
  for (KvDtype kv : {KvDtype::kFp32, KvDtype::kInt8, KvDtype::kK8V4}) {
    DYNAMIC_SECTION("kv " << KvDtypeName(kv)) {
      Setup gpu;
      gpu.kv_dtype = kv;
      gpu.num_blocks = 8;
      gpu.max_num_seqs = 4;
      gpu.max_model_len = 128;  // one sequence must fit the pool (kv_pool_plan.h)
      Setup cpu = gpu;
      cpu.device = "cpu";
      std::unique_ptr<ModelRunner> g = MakeRunner(gpu);
      std::unique_ptr<ModelRunner> c = MakeRunner(cpu);
      auto* cuda = dynamic_cast<CudaModelRunner*>(g.get());
      REQUIRE(cuda != nullptr);
      const int layers = g->config().num_layers;
      const std::vector<int32_t> ids = Stories().tokenizer->Encode(
          "Once upon a time, there was a little girl named Lily.", true);
      std::vector<int32_t> cg = {0, 0, 0}, cc = cg;
      // Seq 0: 4 sinks, positions 600.. (past 512); seq 1: stats only;
      // seq 2: neither.
      const std::vector<int32_t> shift = {600, 0, 0}, sinks = {4, 0, 0};
      const std::vector<uint8_t> stats = {1, 1, 0};
      auto step = [&](std::vector<int32_t> rows, std::vector<int32_t> sk, std::vector<uint8_t> st) {
        const BatchInput bg = Step(ids, cg, rows, shift, sk, st);
        const BatchInput bc = Step(ids, cc, rows, shift, sk, st);
        std::vector<float> lg(bg.logits_rows.size() * 512), lc(lg.size());
        absl::Status s = g->Forward(bg, lg);
        INFO(s.message());
        REQUIRE(s.ok());
        REQUIRE(c->Forward(bc, lc).ok());
        RequireClose(lg, lc, kv == KvDtype::kFp32 ? 2e-3 : 2e-2, "logits");
        const int64_t n = StatsFloats(bg, layers);
        std::vector<float> sg(n + 1, -1.0f), sc(n + 1, -1.0f);
        REQUIRE(g->ReadAttentionStats(sg).ok());
        REQUIRE(c->ReadAttentionStats(sc).ok());
        REQUIRE(sg[n] == -1.0f);  // nothing written past the total
        RequireClose(sg, sc, 1e-3, "attention statistics");
        if (n > 0) {
          double total = 0;
          for (int64_t i = 0; i < n; ++i) total += sg[i];
          REQUIRE(total > 0.5);  // something was recorded
        }
      };
      step({12, 9, 5}, sinks, stats);  // prefills
      step({1, 1, 1}, sinks, stats);   // decode
      step({1, 3, 1}, sinks, {});      // sinks, no statistics
      step({1, 1, 1}, {}, stats);      // statistics, no sinks: still eager
      // Move seq 0's index 13 over index 5 (inside block 0) and seq 1's
      // index 11 over index 2 (block 2): exactly those bytes change.
      const KvFormat& f = g->kv_format();
      std::vector<std::vector<uint8_t>> before;
      for (int l = 0; l < layers; ++l) {
        for (int32_t blk : {0, 2}) before.push_back(*cuda->ReadBlock(l, blk));
      }
      const std::vector<SlotMove> moves = {{13, 5}, {2 * 16 + 11, 2 * 16 + 2}};
      REQUIRE(g->MoveSlots(moves).ok());
      REQUIRE(c->MoveSlots(moves).ok());
      const KvPageLayout& lay = f.layout();
      for (int l = 0; l < layers; ++l) {
        for (int i = 0; i < 2; ++i) {
          std::vector<uint8_t> want = before[l * 2 + i];
          const int so = i == 0 ? 13 : 11, dof = i == 0 ? 5 : 2;
          for (int h = 0; h < lay.num_kv_heads; ++h) {
            for (const KvPartLayout* part : {&lay.k, &lay.v}) {
              std::memmove(want.data() + lay.RowOffset(*part, h, dof),
                           want.data() + lay.RowOffset(*part, h, so), part->row_bytes);
              std::memmove(want.data() + lay.MetaOffset(*part, h, dof),
                           want.data() + lay.MetaOffset(*part, h, so), part->meta_bytes);
            }
          }
          REQUIRE(*cuda->ReadBlock(l, i == 0 ? 0 : 2) == want);
          REQUIRE(want != before[l * 2 + i]);
        }
      }
      step({1, 1, 1}, sinks, stats);  // after the moves
      REQUIRE(cuda->Synchronize().ok());
    }
  }
}

// ---- Engine level ----------------------------------------------------------

std::vector<GenerateRequest> EvictingRequests(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  const KvPolicyOverride policies[] = {
      Policy("streaming", 48, 4), Policy("streaming", 40, 0),   Policy("h2o", 40),
      Policy("scissorhands", 36), Policy("sliding_window", 32), Policy("none", 0)};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < count; ++i) {
    GenerateRequest r = Greedy(RandomSnippet(rng, 400), 40 + rng() % 60);
    r.kv_policy = policies[i % std::size(policies)];
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST_CASE("[gpu] every eviction policy gives the CPU engine's greedy tokens", "[gpu][eviction]") {
  const std::vector<GenerateRequest> reqs = EvictingRequests(91, 24);
  for (KvDtype kv : {KvDtype::kFp32, KvDtype::kFp16, KvDtype::kInt8, KvDtype::kK8V4}) {
    DYNAMIC_SECTION("kv " << KvDtypeName(kv)) {
      Setup gpu;
      gpu.kv_dtype = kv;
      gpu.block_size = kv == KvDtype::kFp32 ? 4 : 16;
      gpu.num_blocks = 24 * 512 / gpu.block_size;
      gpu.max_num_batched_tokens = 256;
      Setup cpu = gpu;
      cpu.device = "cpu";
      auto g = MakeEngine(gpu);
      auto c = MakeEngine(cpu);
      std::vector<Result> on_gpu = RunConcurrently(*g, reqs);
      std::vector<Result> on_cpu = RunConcurrently(*c, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << " (" << reqs[i].kv_policy.policy << "): " << reqs[i].prompt);
        REQUIRE(on_gpu[i].tokens[0].size() == static_cast<size_t>(reqs[i].max_tokens));
        REQUIRE(on_gpu[i].tokens == on_cpu[i].tokens);
      }
      const EngineStats st = g->GetStats();
      for (EvictionPolicyKind k :
           {EvictionPolicyKind::kSlidingWindow, EvictionPolicyKind::kStreaming,
            EvictionPolicyKind::kH2o, EvictionPolicyKind::kScissorhands}) {
        INFO(EvictionPolicyName(k));
        CHECK(st.kv_evictions[static_cast<int>(k)] > 0);
      }
      RequireAllBlocksFree(*g);
    }
  }
}

TEST_CASE("[gpu] streaming generates past the model's 512 positions as on the CPU",
          "[gpu][eviction]") {
  Setup gpu;
  Setup cpu = gpu;
  cpu.device = "cpu";
  auto g = MakeEngine(gpu);
  auto c = MakeEngine(cpu);
  for (int32_t sinks : {4, 0}) {
    GenerateRequest r = Greedy("Once upon a time", 900);
    r.ignore_eos = true;
    r.kv_policy = Policy("streaming", 64, sinks);
    const Result on_gpu = RunOne(*g, r);
    const Result on_cpu = RunOne(*c, r);
    REQUIRE(on_gpu.tokens[0].size() == 900);
    REQUIRE(on_gpu.tokens == on_cpu.tokens);
  }
  RequireAllBlocksFree(*g);
}

}  // namespace
}  // namespace kvserve
