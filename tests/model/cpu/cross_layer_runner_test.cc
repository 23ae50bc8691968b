// Cross-layer KV sharing (cache.cross_layer) through CpuModelRunner on
// stories260K: a row's logits do not depend on how its sequence was cut
// into steps (rounds at block boundaries), threshold 1 (every token merged)
// against the plain cache within a stated tolerance, threshold 0 with every
// slot retained equal to it bit for bit, and the option and batch errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/runner_factory.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/stories260k.h"

namespace kvserve {
namespace {

using testing::Stories260k;

std::vector<int32_t> Prompt() {
  static const std::vector<int32_t> p = testing::LilyPrompt(/*longer=*/true);
  return p;
}

KvCrossLayerSpec Cross(int from, double threshold, double retain = 0.125) {
  KvCrossLayerSpec c;
  c.from_layer = from;
  c.threshold = threshold;
  c.retain = retain;
  return c;
}

absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(KvDtype dtype, KvCrossLayerSpec cross,
                                                       int block_size = 16, int threads = 2) {
  CpuRunnerOptions opt;
  opt.kv_dtype = dtype;
  opt.block_size = block_size;
  opt.num_blocks = 40;
  opt.num_threads = threads;
  opt.cross_layer = cross;
  return CpuModelRunner::Create(Stories260k(), opt);
}

std::unique_ptr<CpuModelRunner> MakeRunner(KvDtype dtype, KvCrossLayerSpec cross,
                                           int block_size = 16, int threads = 2) {
  auto r = Create(dtype, cross, block_size, threads);
  REQUIRE(r.ok());
  return std::move(*r);
}

// Appends a sequence of `tokens` over block ids `table` (every row of the
// batch's block table is max_blocks_per_seq long) and tail `tail`: rows
// [begin, end), every row's logits.
void AddSeq(BatchInput* b, const std::vector<int32_t>& tokens, int bs,
            const std::vector<int32_t>& table, int32_t tail, int32_t begin, int32_t end) {
  b->block_table.insert(b->block_table.end(), table.begin(), table.end());
  for (int32_t i = begin; i < end; ++i) {
    b->token_ids.push_back(tokens[i]);
    b->positions.push_back(i);
    b->slot_mapping.push_back(int64_t{table[i / bs]} * bs + i % bs);
    b->logits_rows.push_back(b->num_tokens() - 1);
  }
  b->query_start.push_back(b->num_tokens());
  b->context_len.push_back(end);
  b->tail_ids.push_back(tail);
}

// Block ids first, first + 1, ... for `n` tokens.
std::vector<int32_t> Blocks(int32_t first, int32_t n, int bs) {
  std::vector<int32_t> t((n + bs - 1) / bs);
  for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

// One sequence in blocks 0, 1, ... and tail 0: rows [begin, end).
BatchInput StepBatch(const std::vector<int32_t>& tokens, int bs, int32_t begin, int32_t end) {
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = (end + bs - 1) / bs;
  AddSeq(&b, tokens, bs, Blocks(0, end, bs), 0, begin, end);
  return b;
}

// Every row's logits over `tokens`, in steps of `chunk` rows.
std::vector<float> AllLogits(CpuModelRunner& r, const std::vector<int32_t>& tokens, int chunk) {
  std::vector<float> all, step;
  const int bs = r.kv_format().block_size();
  const int32_t n = static_cast<int32_t>(tokens.size());
  for (int32_t begin = 0; begin < n; begin += chunk) {
    const BatchInput b = StepBatch(tokens, bs, begin, std::min(n, begin + chunk));
    step.resize(b.logits_rows.size() * r.config().vocab_size);
    REQUIRE(r.Forward(b, step).ok());
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

}  // namespace

TEST_CASE("cross-layer logits do not depend on how a sequence is cut into steps", "[model]") {
  const std::vector<int32_t> tokens = Prompt();
  REQUIRE(tokens.size() > 40);
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kInt8}) {
    for (int bs : {8, 16}) {
      DYNAMIC_SECTION(KvDtypeName(dtype) << ", block size " << bs) {
        auto r = MakeRunner(dtype, Cross(1, 0.05), bs);
        const std::vector<float> whole = AllLogits(*r, tokens, static_cast<int>(tokens.size()));
        REQUIRE(AllLogits(*r, tokens, 7) == whole);
        REQUIRE(AllLogits(*r, tokens, 1) == whole);
        REQUIRE(AllLogits(*r, tokens, bs) == whole);
        REQUIRE(AllLogits(*r, tokens, bs + 3) == whole);
        // One thread: the same bits.
        auto one = MakeRunner(dtype, Cross(1, 0.05), bs, 1);
        REQUIRE(AllLogits(*one, tokens, 5) == whole);
      }
    }
  }
}

TEST_CASE("cross-layer: sequences batched together see what they see alone", "[model]") {
  const std::vector<int32_t> tokens = Prompt();
  const int bs = 16;
  const int32_t n = static_cast<int32_t>(tokens.size());
  auto r = MakeRunner(KvDtype::kFp32, Cross(1, 0.05), bs);
  const std::vector<float> alone = AllLogits(*r, tokens, n);
  const int vocab = r->config().vocab_size;
  // Sequence 0 in blocks 0.., tail 0, cut at 5, 23, n; sequence 1 in blocks
  // 20.., tail 1, cut at 30, 37, n: the steps' rows cross blocks differently.
  const std::vector<int32_t> cuts[2] = {{0, 5, 23, n}, {0, 30, 37, n}};
  std::vector<float> got[2];
  for (int step = 0; step < 3; ++step) {
    BatchInput b;
    b.Clear();
    b.max_blocks_per_seq = (n + bs - 1) / bs;
    for (int s = 0; s < 2; ++s) {
      AddSeq(&b, tokens, bs, Blocks(20 * s, n, bs), s, cuts[s][step], cuts[s][step + 1]);
    }
    std::vector<float> logits(b.logits_rows.size() * vocab);
    REQUIRE(r->Forward(b, logits).ok());
    const size_t split = static_cast<size_t>(b.query_start[1]) * vocab;
    got[0].insert(got[0].end(), logits.begin(), logits.begin() + split);
    got[1].insert(got[1].end(), logits.begin() + split, logits.end());
  }
  REQUIRE(got[0] == alone);
  REQUIRE(got[1] == alone);
}

TEST_CASE("cross-layer: a second sequence on the first's merged blocks sees what it computes",
          "[model]") {
  const std::vector<int32_t> tokens = Prompt();
  const int bs = 16;
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t hit = 2 * bs;
  auto r = MakeRunner(KvDtype::kFp32, Cross(1, 0.05), bs);
  const int vocab = r->config().vocab_size;
  const std::vector<float> alone = AllLogits(*r, tokens, 9);
  // Sequence 0 again (blocks 0..), then sequence 1 in blocks 0, 1 (shared)
  // and 20.., tail 1, from index `hit` on.
  (void)AllLogits(*r, tokens, n);
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = (n + bs - 1) / bs;
  std::vector<int32_t> table = Blocks(20, n, bs);
  table[0] = 0;
  table[1] = 1;
  AddSeq(&b, tokens, bs, table, 1, hit, n);
  std::vector<float> logits(b.logits_rows.size() * vocab);
  REQUIRE(r->Forward(b, logits).ok());
  REQUIRE(std::vector<float>(alone.begin() + size_t{hit} * vocab, alone.end()) == logits);
}

TEST_CASE("cross-layer: random steps over four sequences see what each sees alone", "[model]") {
  const std::vector<int32_t> tokens = Prompt();
  const int bs = 16;
  const int32_t n = static_cast<int32_t>(tokens.size());
  auto r = MakeRunner(KvDtype::kFp32, Cross(2, 0.05), bs);
  const int vocab = r->config().vocab_size;
  const std::vector<float> alone = AllLogits(*r, tokens, n);
  std::mt19937 rng(3);
  const int S = 4;
  std::vector<int32_t> done(S, 0);
  std::vector<std::vector<float>> got(S);
  const int32_t mb = (n + bs - 1) / bs;
  while (*std::min_element(done.begin(), done.end()) < n) {
    BatchInput b;
    b.Clear();
    b.max_blocks_per_seq = mb;
    std::vector<int> seqs;
    for (int s = 0; s < S; ++s) {
      if (done[s] >= n || rng() % 3 == 0) continue;
      const int32_t end = std::min<int32_t>(n, done[s] + 1 + rng() % 40);
      AddSeq(&b, tokens, bs, Blocks(10 * s, n, bs), s, done[s], end);
      done[s] = end;
      seqs.push_back(s);
    }
    if (seqs.empty()) continue;

    std::vector<float> logits(b.logits_rows.size() * vocab);
    REQUIRE(r->Forward(b, logits).ok());
    for (size_t k = 0; k < seqs.size(); ++k) {
      got[seqs[k]].insert(got[seqs[k]].end(),
                          logits.begin() + static_cast<size_t>(b.query_start[k]) * vocab,
                          logits.begin() + static_cast<size_t>(b.query_start[k + 1]) * vocab);
    }
  }
  for (int s = 0; s < S; ++s) REQUIRE(got[s] == alone);
}

TEST_CASE("cross-layer against the plain cache on the same tokens", "[model]") {
  const std::vector<int32_t> tokens = Prompt();
  const int32_t n = static_cast<int32_t>(tokens.size());
  auto plain = MakeRunner(KvDtype::kFp32, {});
  const std::vector<float> want = AllLogits(*plain, tokens, n);
  SECTION(
      "every slot retainable and threshold 0: only equal rows merge, the plain cache's logits") {
    auto r = MakeRunner(KvDtype::kFp32, Cross(0, 0.0, 1.0));
    // Only the kernels' sum order differs.
    REQUIRE(MaxAbsDiff(AllLogits(*r, tokens, 11), want) < 1e-4);
  }
  SECTION("threshold 1: every token of layers 2 and 3 merged, logits near the plain cache's") {
    auto r = MakeRunner(KvDtype::kFp32, Cross(2, 1.0));
    const std::vector<float> got = AllLogits(*r, tokens, n);
    REQUIRE(MaxAbsDiff(got, want) > 1e-3);  // it does merge
    const int vocab = plain->config().vocab_size;
    int agree = 0;
    for (int32_t r = 0; r < n; ++r) {
      auto top = [&](const std::vector<float>& l) {
        return std::max_element(l.begin() + size_t{static_cast<size_t>(r)} * vocab,
                                l.begin() + size_t{static_cast<size_t>(r + 1)} * vocab) -
               l.begin();
      };
      agree += top(got) == top(want) ? 1 : 0;
    }
    CAPTURE(agree, n);
    // Measured: 60 of 79 positions keep the plain cache's argmax.
    REQUIRE(agree * 10 >= n * 7);
  }
}

TEST_CASE("cross-layer refusals name cache.cross_layer", "[model]") {
  SECTION("int4_kc and int2_kc pages") {
    for (KvDtype d : {KvDtype::kInt4Kc, KvDtype::kInt2Kc}) {
      auto r = Create(d, Cross(2, 0.1));
      REQUIRE_FALSE(r.ok());
      REQUIRE(std::string(r.status().message()) ==
              absl::StrCat("cache.cross_layer: kv_dtype ", std::string(KvDtypeName(d)),
                           " keeps per-block K ranges and tails; cross-layer pages take a "
                           "per-token kv_dtype"));
    }
  }
  SECTION("eviction: no slot moves, no sinks; no tiers") {
    auto r = MakeRunner(KvDtype::kFp32, Cross(2, 0.1));
    REQUIRE_FALSE(r->supports_eviction());
    REQUIRE_FALSE(r->supports_kv_tiers());
    BatchInput b = StepBatch(Prompt(), 16, 0, 4);
    b.num_sinks = {2};
    std::vector<float> logits(4 * r->config().vocab_size);
    REQUIRE(std::string(r->Forward(b, logits).message()) ==
            "cache.cross_layer: KV eviction (sinks) is refused");
    b.num_sinks.clear();
    b.attention_stats = {1};
    REQUIRE(std::string(r->Forward(b, logits).message()) ==
            "cache.cross_layer: attention statistics are refused");
  }
  SECTION("the CUDA runner") {
    RunnerOptions o;
    o.device = "cuda:0";
    o.cross_layer = Cross(2, 0.1);
    REQUIRE(std::string(CheckRunnerDevice(o).message()) ==
            "cache.cross_layer: cross-layer KV sharing runs on the CPU runner only (model.device: "
            "cpu); cuda:0 takes a cache without cache.cross_layer");
  }
  SECTION("a from_layer past the model") {
    auto r = Create(KvDtype::kFp32, Cross(4, 0.1));
    REQUIRE(
        std::string(r.status().message()) ==
        "cache.cross_layer.from_layer: 4 leaves no pair of layers (the model has 5; at most 3)");
  }
}

}  // namespace kvserve
