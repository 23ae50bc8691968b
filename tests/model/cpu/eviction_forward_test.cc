// Eviction through the CPU forward pass: StreamingLLM positions (a streaming
// sequence predicts what a fresh prompt of its sinks and window predicts at
// positions 0 ..), RoPE past the model's table, attention statistics per
// sequence and layer, slot moves byte for byte, and a sequence within its
// budget computing exactly what policy none computes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cache/eviction/eviction_policy.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/eval/evicting_sequence.h"
#include "tests/model/random_weights.h"

namespace kvserve {
namespace {

ModelConfig SmallConfig(int layers, RopeStyle style) {
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.num_layers = layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 61;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  c.rope_style = style;
  c.bos_id = 1;
  c.eos_id = 2;
  return c;
}

std::unique_ptr<CpuModelRunner> MakeRunner(const ModelConfig& c, KvDtype dtype, int block_size,
                                           int32_t num_blocks) {
  CpuRunnerOptions opt;
  opt.kv_dtype = dtype;
  opt.block_size = block_size;
  opt.num_blocks = num_blocks;
  opt.num_threads = 1;
  auto r = CpuModelRunner::Create(testing::RandomWeights(c, 7), opt);
  REQUIRE(r.ok());
  return std::move(*r);
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = std::uniform_int_distribution<int>(3, vocab - 1)(rng);
  return t;
}

EvictionParams Streaming(int32_t budget, int32_t sinks) {
  EvictionParams p;
  p.policy = EvictionPolicyKind::kStreaming;
  p.budget = budget;
  p.sink_tokens = sinks;
  return p;
}

float MaxAbsDiff(const float* a, const float* b, int n) {
  float d = 0.0f;
  for (int i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_CASE("a streaming sequence attends as StreamingLLM places its cache", "[model][eviction]") {
  // With one layer a kept entry's K/V depend only on its token and position,
  // so a streaming step must give what a fresh prompt of the sinks and the
  // window gives at positions 0 .. budget - 1: the window keys keep their
  // relative distances, the sinks are scored with the in-cache query.
  const RopeStyle style = GENERATE(RopeStyle::kNeox, RopeStyle::kInterleaved);
  const int32_t sinks = GENERATE(0, 1, 4);
  const ModelConfig c = SmallConfig(1, style);
  const int32_t budget = 12, n = 150;  // runs past the 64-position table
  auto runner = MakeRunner(c, KvDtype::kFp32, 4, 64);
  auto fresh_runner = MakeRunner(c, KvDtype::kFp32, 4, 64);
  const std::vector<int32_t> stream = RandomTokens(n, c.vocab_size, 3);
  EvictingSequence seq(*runner, MakeEvictionPolicy(EvictionPolicyKind::kStreaming),
                       Streaming(budget, sinks), budget);
  EvictingSequence fresh(*fresh_runner, nullptr, EvictionParams{}, 0);
  std::vector<float> logits, fresh_logits;
  REQUIRE(seq.Step(stream, 0, budget, &logits).ok());
  for (int32_t t = budget; t < n; ++t) {
    INFO("token " << t << ", sinks " << sinks);
    REQUIRE(seq.Step(stream, t, t + 1, &logits).ok());
    REQUIRE(seq.cache_len() == budget - 1);
    // The fresh prompt: sinks, then the budget - sinks newest tokens.
    std::vector<int32_t> prompt(stream.begin(), stream.begin() + sinks);
    prompt.insert(prompt.end(), stream.begin() + t + 1 - (budget - sinks), stream.begin() + t + 1);
    fresh.Reset();
    REQUIRE(fresh.Step(prompt, 0, budget, &fresh_logits).ok());
    const float* want = fresh_logits.data() + (budget - 1) * c.vocab_size;
    REQUIRE(MaxAbsDiff(logits.data(), want, c.vocab_size) < 2e-4f);
  }
  REQUIRE(seq.evictor()->num_evicted() == n - (budget - 1));
  REQUIRE(seq.max_blocks_held() == budget / 4);
}

TEST_CASE("without sinks, streaming and sliding_window are the same window", "[model][eviction]") {
  const ModelConfig c = SmallConfig(3, RopeStyle::kNeox);
  auto a = MakeRunner(c, KvDtype::kInt8, 4, 16);
  auto b = MakeRunner(c, KvDtype::kInt8, 4, 16);
  EvictionParams window;
  window.policy = EvictionPolicyKind::kSlidingWindow;
  window.budget = 10;
  EvictingSequence s1(*a, MakeEvictionPolicy(EvictionPolicyKind::kStreaming), Streaming(10, 0), 10);
  EvictingSequence s2(*b, MakeEvictionPolicy(EvictionPolicyKind::kSlidingWindow), window, 10);
  const std::vector<int32_t> stream = RandomTokens(90, c.vocab_size, 5);
  std::vector<float> l1, l2;
  for (int32_t t = 0; t < 90;) {
    const int32_t rows = s1.StepRows(t < 20 ? 20 - t : 0);
    REQUIRE(rows == s2.StepRows(t < 20 ? 20 - t : 0));
    REQUIRE(s1.Step(stream, t, t + rows, &l1).ok());
    REQUIRE(s2.Step(stream, t, t + rows, &l2).ok());
    REQUIRE(l1 == l2);
    t += rows;
  }
}

TEST_CASE("a model's own sliding window: evicting to it computes what the window computes",
          "[model][eviction]") {
  ModelConfig c = SmallConfig(3, RopeStyle::kNeox);
  c.sliding_window = 16;
  auto a = MakeRunner(c, KvDtype::kFp32, 4, 32);
  auto b = MakeRunner(c, KvDtype::kFp32, 4, 32);
  EvictionParams p;
  p.policy = EvictionPolicyKind::kSlidingWindow;
  p.budget = 16;
  // The engine's hold limit for such models is the window itself.
  EvictingSequence evicting(*a, MakeEvictionPolicy(p.policy), p, 16);
  EvictingSequence dense(*b, nullptr, EvictionParams{}, 0);
  const std::vector<int32_t> stream = RandomTokens(60, c.vocab_size, 13);
  std::vector<float> all, l;
  REQUIRE(dense.Step(stream, 0, 60, &all).ok());
  for (int32_t t = 0; t < 60;) {
    const int32_t rows = evicting.StepRows(60 - t);
    REQUIRE(evicting.Step(stream, t, t + rows, &l).ok());
    REQUIRE(evicting.cache_len() <= 15);
    // Same keys, summed in another order.
    REQUIRE(MaxAbsDiff(l.data(), all.data() + static_cast<size_t>(t) * c.vocab_size,
                       rows * c.vocab_size) < 1e-4f);
    t += rows;
  }
  REQUIRE(evicting.max_blocks_held() == 16 / 4);
}

TEST_CASE("a sequence within its budget computes exactly what policy none computes",
          "[model][eviction]") {
  const ModelConfig c = SmallConfig(2, RopeStyle::kNeox);
  for (EvictionPolicyKind kind :
       {EvictionPolicyKind::kH2o, EvictionPolicyKind::kScissorhands, EvictionPolicyKind::kStreaming,
        EvictionPolicyKind::kSlidingWindow}) {
    auto a = MakeRunner(c, KvDtype::kFp32, 4, 16);
    auto b = MakeRunner(c, KvDtype::kFp32, 4, 16);
    EvictionParams p;
    p.policy = kind;
    p.budget = 60;
    EvictingSequence evicting(*a, MakeEvictionPolicy(kind), p, 64);
    EvictingSequence plain(*b, nullptr, EvictionParams{}, 0);
    const std::vector<int32_t> stream = RandomTokens(59, c.vocab_size, 9);
    std::vector<float> l1, l2;
    REQUIRE(evicting.Step(stream, 0, 30, &l1).ok());
    REQUIRE(plain.Step(stream, 0, 30, &l2).ok());
    REQUIRE(l1 == l2);
    for (int32_t t = 30; t < 59; ++t) {
      REQUIRE(evicting.Step(stream, t, t + 1, &l1).ok());
      REQUIRE(plain.Step(stream, t, t + 1, &l2).ok());
      REQUIRE(l1 == l2);
    }
    REQUIRE(evicting.evictor()->num_evicted() == 0);
  }
}

TEST_CASE("dense attention runs past the model's positions", "[model][eviction]") {
  const ModelConfig c = SmallConfig(2, RopeStyle::kInterleaved);
  auto runner = MakeRunner(c, KvDtype::kFp32, 8, 32);
  EvictingSequence seq(*runner, nullptr, EvictionParams{}, 0);
  const std::vector<int32_t> stream = RandomTokens(200, c.vocab_size, 11);
  std::vector<float> logits;
  REQUIRE(seq.Step(stream, 0, 200, &logits).ok());
  REQUIRE(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("attention statistics: per sequence and layer, one weight per head and row",
          "[model][eviction]") {
  const ModelConfig c = SmallConfig(3, RopeStyle::kNeox);
  auto runner = MakeRunner(c, KvDtype::kFp32, 4, 16);
  // Two sequences: 5 prompt rows with statistics, 3 without.
  BatchInput batch;
  batch.Clear();
  batch.token_ids = {5, 6, 7, 8, 9, 10, 11, 12};
  batch.positions = {0, 1, 2, 3, 4, 0, 1, 2};
  batch.slot_mapping = {0, 1, 2, 3, 4, 8, 9, 10};
  batch.query_start = {0, 5, 8};
  batch.context_len = {5, 3};
  batch.max_blocks_per_seq = 2;
  batch.block_table = {0, 1, 2, 3};
  batch.logits_rows = {4, 7};
  batch.attention_stats = {1, 0};
  std::vector<float> logits(2 * c.vocab_size);
  REQUIRE(runner->Forward(batch, logits).ok());
  std::vector<float> stats(3 * 5, -1.0f);
  REQUIRE(runner->ReadAttentionStats(stats).ok());
  for (int l = 0; l < 3; ++l) {
    const float* s = stats.data() + l * 5;
    // Every row gives weight 1 per head: 5 rows x 4 heads per layer.
    REQUIRE(std::accumulate(s, s + 5, 0.0f) == Approx(20.0f));
    // Entry 0 is seen by all five rows, so it collects at least row 0's 4.
    REQUIRE(s[0] >= 4.0f - 1e-5f);
    // The last entry is seen by the last row only.
    REQUIRE(s[4] <= 4.0f + 1e-5f);
    REQUIRE(std::all_of(s, s + 5, [](float x) { return x > 0.0f; }));
  }
  std::vector<float> small(14);
  REQUIRE(runner->ReadAttentionStats(small).code() == absl::StatusCode::kInvalidArgument);

  SECTION("the batch validator names malformed eviction fields") {
    batch.num_sinks = {1};
    REQUIRE(std::string(runner->Forward(batch, logits).message()) ==
            "BatchInput: num_sinks has 1 entries, want 0 or num_seqs = 2");
  }
}

TEST_CASE("MoveSlots copies one token's K and V bytes in every layer", "[model][eviction]") {
  const ModelConfig c = SmallConfig(2, RopeStyle::kNeox);
  auto runner = MakeRunner(c, KvDtype::kInt8, 4, 4);
  BatchInput batch;
  batch.Clear();
  batch.token_ids = {5, 6, 7};
  batch.positions = {0, 1, 2};
  batch.slot_mapping = {0, 1, 2};
  batch.query_start = {0, 3};
  batch.context_len = {3};
  batch.max_blocks_per_seq = 1;
  batch.block_table = {0};
  std::vector<float> logits;
  REQUIRE(runner->Forward(batch, logits).ok());
  REQUIRE(runner->MoveSlots(std::vector<SlotMove>{{2, 13}, {0, 5}}).ok());
  const HostKvPages& pages = runner->primary_pages();
  const KvPageLayout& f = pages.format().layout();
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (const KvPartLayout* part : {&f.k, &f.v}) {
        auto row = [&](int32_t block, int slot) {
          return pages.block(l, block) + f.RowOffset(*part, h, slot);
        };
        auto meta = [&](int32_t block, int slot) {
          return pages.block(l, block) + f.MetaOffset(*part, h, slot);
        };
        REQUIRE(std::memcmp(row(3, 1), row(0, 2), part->row_bytes) == 0);
        REQUIRE(std::memcmp(meta(3, 1), meta(0, 2), part->meta_bytes) == 0);
        REQUIRE(std::memcmp(row(1, 1), row(0, 0), part->row_bytes) == 0);
        REQUIRE(std::memcmp(meta(1, 1), meta(0, 0), part->meta_bytes) == 0);
      }
    }
  }
}

}  // namespace
}  // namespace kvserve
