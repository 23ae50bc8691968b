// CpuForward's two ways of splitting a step over threads (over rows, and over
// output features for the few rows of a big model) against one thread: every
// logit is bit-identical, for prefill and decode, alone and batched. The
// model is wide enough (stories110M's layer width) that one decoding row
// takes the split over output features; stories260K never does.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "model/cpu/cpu_model_runner.h"
#include "model/cpu/cpu_threads.h"
#include "tests/model/random_weights.h"

namespace kvserve {
namespace {

constexpr int kBlockSize = 16;
constexpr int32_t kMaxBlocks = 4;  // 64 positions per sequence

const LlamaWeights& WideModel() {
  static const LlamaWeights* w = [] {
    ModelConfig c;
    c.name = "wide";
    c.architecture = "LlamaForCausalLM";
    c.dim = 768;
    c.hidden_dim = 2048;
    c.num_layers = 2;
    c.num_heads = 12;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.vocab_size = 512;
    c.max_position_embeddings = 256;
    // Every optional per-row and per-feature step is on the path.
    c.qkv_bias = true;
    c.o_bias = true;
    c.qk_norm = true;
    REQUIRE(c.Validate().ok());
    return new LlamaWeights(testing::RandomWeights(c, 14));
  }();
  return *w;
}

std::unique_ptr<CpuModelRunner> MakeRunner(int num_seqs, int threads) {
  CpuRunnerOptions opt;
  opt.block_size = kBlockSize;
  opt.num_blocks = num_seqs * kMaxBlocks;
  opt.num_threads = threads;
  auto r = CpuModelRunner::Create(WideModel(), opt);
  REQUIRE(r.ok());
  REQUIRE((*r)->num_threads() == threads);
  return std::move(*r);
}

int32_t TokenAt(int seq, int32_t pos) { return 3 + (seq * 131 + pos * 17) % 500; }

// Logits of (sequence, position) for every row computed.
using Logits = std::map<std::pair<int, int32_t>, std::vector<float>>;

// One step: sequences `seqs` (ids into the pool: sequence s owns blocks
// [s * kMaxBlocks, (s + 1) * kMaxBlocks)) each add `counts[i]` tokens after
// the `cached[s]` they have; every row asks for logits.
void Step(CpuModelRunner& runner, const std::vector<int>& seqs, const std::vector<int32_t>& counts,
          std::vector<int32_t>& cached, Logits& out) {
  const int vocab = runner.config().vocab_size;
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = kMaxBlocks;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int s = seqs[i];
    for (int32_t j = 0; j < kMaxBlocks; ++j) b.block_table.push_back(s * kMaxBlocks + j);
    for (int32_t p = cached[s]; p < cached[s] + counts[i]; ++p) {
      b.logits_rows.push_back(b.num_tokens());
      b.token_ids.push_back(TokenAt(s, p));
      b.positions.push_back(p);
      b.slot_mapping.push_back(int64_t{s} * kMaxBlocks * kBlockSize + p);
    }
    cached[s] += counts[i];
    b.query_start.push_back(b.num_tokens());
    b.context_len.push_back(cached[s]);
  }
  std::vector<float> logits(b.logits_rows.size() * vocab);
  REQUIRE(runner.Forward(b, logits).ok());
  size_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int32_t p = cached[seqs[i]] - counts[i]; p < cached[seqs[i]]; ++p, ++row) {
      out[{seqs[i], p}].assign(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
    }
  }
}

TEST_CASE("num_threads 0 takes what the cgroup quota and the affinity mask allow", "[model]") {
  CpuRunnerOptions opt;
  opt.block_size = kBlockSize;
  opt.num_blocks = kMaxBlocks;
  opt.num_threads = 0;
  auto r = CpuModelRunner::Create(WideModel(), opt);
  REQUIRE(r.ok());
  REQUIRE((*r)->num_threads() == DefaultCpuThreads());
}

TEST_CASE("Splits over rows and over output features give one thread's bits", "[model]") {
  const std::vector<int32_t> prompt = {40, 9, 17, 3, 26};  // 95 rows: a split over rows
  const int n = static_cast<int>(prompt.size());
  constexpr int kDecode = 3;  // steps of one row per sequence: a split over features

  // Each sequence alone on one thread.
  Logits want;
  {
    auto runner = MakeRunner(n, 1);
    std::vector<int32_t> cached(n, 0);
    for (int s = 0; s < n; ++s) {
      Step(*runner, {s}, {prompt[s]}, cached, want);
      for (int d = 0; d < kDecode; ++d) Step(*runner, {s}, {1}, cached, want);
    }
  }
  REQUIRE(want.size() == static_cast<size_t>(95 + n * kDecode));
  for (const auto& [key, row] : want) {
    for (float v : row) REQUIRE(std::isfinite(v));
  }
  auto same = [&](const Logits& got) {
    for (const auto& [key, row] : got) {
      INFO("sequence " << key.first << ", position " << key.second);
      REQUIRE(want.count(key) == 1);
      REQUIRE(std::memcmp(row.data(), want.at(key).data(), row.size() * sizeof(float)) == 0);
    }
  };

  SECTION("all together on two threads: prefill rows split, decode features split") {
    auto runner = MakeRunner(n, 2);
    std::vector<int32_t> cached(n, 0);
    Logits got;
    Step(*runner, {0, 1, 2, 3, 4}, prompt, cached, got);
    for (int d = 0; d < kDecode; ++d) Step(*runner, {0, 1, 2, 3, 4}, {1, 1, 1, 1, 1}, cached, got);
    REQUIRE(got.size() == want.size());
    same(got);
  }
  SECTION("one sequence on two threads, one decoding row split over features") {
    auto runner = MakeRunner(n, 2);
    std::vector<int32_t> cached(n, 0);
    Logits got;
    Step(*runner, {0}, {prompt[0]}, cached, got);
    for (int d = 0; d < kDecode; ++d) Step(*runner, {0}, {1}, cached, got);
    REQUIRE(got.size() == static_cast<size_t>(prompt[0] + kDecode));
    same(got);
  }
  SECTION("three threads, small batches of a few rows in mixed steps") {
    auto runner = MakeRunner(n, 3);
    std::vector<int32_t> cached(n, 0);
    Logits got;
    Step(*runner, {3, 1}, {prompt[3], prompt[1]}, cached, got);  // 12 rows
    Step(*runner, {3, 1, 2}, {1, 1, prompt[2]}, cached, got);    // 19 rows
    Step(*runner, {2, 3}, {1, 1}, cached, got);                  // 2 rows
    REQUIRE(got.size() == static_cast<size_t>(prompt[3] + prompt[1] + prompt[2] + 4));
    same(got);
  }
}

}  // namespace
}  // namespace kvserve
