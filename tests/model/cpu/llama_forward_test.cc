// The CPU forward pass through CpuModelRunner on stories260K: the exact
// reference text, batching invariance (many sequences in one BatchInput give
// the tokens each gives alone, with prefill and decode mixed), and whole-block
// copies between and inside the KV pools.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/loader/llama2c_loader.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/stories260k.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Stories260k;
using testing::Stories260kTok;

std::unique_ptr<CpuModelRunner> MakeRunner(int block_size, int32_t num_blocks,
                                           int32_t num_swap_blocks = 0, int num_threads = 0) {
  CpuRunnerOptions opt;
  opt.block_size = block_size;
  opt.num_blocks = num_blocks;
  opt.num_swap_blocks = num_swap_blocks;
  opt.num_threads = num_threads;
  auto r = CpuModelRunner::Create(Stories260k(), opt);
  REQUIRE(r.ok());
  return std::move(*r);
}

int32_t Argmax(const float* row, int n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// One sequence as the test drives it: its tokens, how many are cached, and
// where they live.
struct TestSeq {
  std::vector<int32_t> tokens;  // prompt, then generated
  int32_t prompt_len = 0;
  int32_t cached = 0;
  BlockTable table;
  explicit TestSeq(std::vector<int32_t> prompt, int block_size)
      : tokens(std::move(prompt)),
        prompt_len(static_cast<int32_t>(tokens.size())),
        table(block_size) {}
  std::vector<int32_t> generated() const {
    return std::vector<int32_t>(tokens.begin() + prompt_len, tokens.end());
  }
};

// Builds one step's BatchInput from (sequence, number of new tokens) pairs;
// every sequence's last new row wants logits when it ends its prompt or decodes.
class StepBuilder {
 public:
  StepBuilder(BlockPool& pool, int32_t max_blocks) : pool_(pool), max_blocks_(max_blocks) {
    batch_.Clear();
    batch_.max_blocks_per_seq = max_blocks;
  }

  void Add(TestSeq& s, int32_t n) {
    const int32_t start = s.cached;
    while (s.table.num_blocks() < s.table.BlocksFor(start + n)) {
      auto id = pool_.Allocate();
      REQUIRE(id.has_value());
      s.table.AppendBlock(*id);
    }
    for (int32_t i = start; i < start + n; ++i) {
      batch_.token_ids.push_back(s.tokens[i]);
      batch_.positions.push_back(i);
      batch_.slot_mapping.push_back(s.table.SlotOf(i));
    }
    batch_.query_start.push_back(batch_.query_start.back() + n);
    batch_.context_len.push_back(start + n);
    for (int32_t j = 0; j < max_blocks_; ++j) {
      batch_.block_table.push_back(j < s.table.num_blocks() ? s.table.blocks()[j] : -1);
    }
    if (start + n >= s.prompt_len) {
      batch_.logits_rows.push_back(batch_.num_tokens() - 1);
      wants_.push_back(&s);
    }
    s.cached = start + n;
    s.table.set_num_tokens(s.cached);
  }

  // Runs the step and appends each logits row's argmax to its sequence.
  void RunGreedy(CpuModelRunner& runner) {
    const int vocab = runner.config().vocab_size;
    std::vector<float> logits(batch_.logits_rows.size() * vocab);
    absl::Status st = runner.Forward(batch_, logits);
    REQUIRE(st.ok());
    for (size_t i = 0; i < wants_.size(); ++i) {
      wants_[i]->tokens.push_back(Argmax(logits.data() + i * vocab, vocab));
    }
  }

  const BatchInput& batch() const { return batch_; }

 private:
  BlockPool& pool_;
  int32_t max_blocks_;
  BatchInput batch_;
  std::vector<TestSeq*> wants_;
};

// Greedy decode of one sequence alone: prefill in one chunk, then one token
// per step, stopping at BOS/EOS or after max_new tokens.
std::vector<int32_t> SoloGreedy(const std::vector<int32_t>& prompt, int block_size, int max_new,
                                bool stop_at_bos = true) {
  const int32_t max_blocks = (512 + block_size - 1) / block_size;
  auto runner = MakeRunner(block_size, max_blocks, 0, 1);
  BlockPool pool(max_blocks);
  TestSeq s(prompt, block_size);
  for (int step = 0; step < max_new; ++step) {
    StepBuilder sb(pool, max_blocks);
    sb.Add(s, static_cast<int32_t>(s.tokens.size()) - s.cached);
    sb.RunGreedy(*runner);
    const int32_t t = s.tokens.back();
    if (t == 2 || (stop_at_bos && t == 1)) break;
  }
  return s.generated();
}

TEST_CASE("Greedy decode from BOS reproduces llama2.c's reference text", "[model]") {
  for (int bs : {1, 16}) {
    DYNAMIC_SECTION("block size " << bs) {
      std::vector<int32_t> gen = SoloGreedy({1}, bs, 256);
      if (!gen.empty() && (gen.back() == 1 || gen.back() == 2)) gen.pop_back();
      REQUIRE(Stories260kTok().Decode(gen, 1) == testing::GoldenGreedyText());
    }
  }
}

const std::vector<std::string>& EightPrompts() {
  static const std::vector<std::string> p = {
      "Once upon a time",
      "Tom and Lily went to the park",
      "The cat",
      "One day, a little boy named Tim found a big red ball in the garden. He",
      "She was sad because",
      "A bird",
      "The sun was shining and the sky was blue. Mom said,",
      "\"Can I play?\" asked"};
  return p;
}

// Generates max_new tokens for every prompt in one runner, all sequences in
// every step. Prefill: chunk_size 0 runs each whole prompt in the first step;
// otherwise prompts advance chunk_size tokens per step (the last chunk may be
// shorter) while sequences that finished their prompt decode alongside.
// Sequences never stop early, so all run for max_new tokens.
std::vector<std::vector<int32_t>> BatchedGreedy(const std::vector<std::vector<int32_t>>& prompts,
                                                int block_size, int max_new, int chunk_size,
                                                int num_threads) {
  const int32_t max_blocks = (512 + block_size - 1) / block_size;
  const int32_t pool_blocks = max_blocks * static_cast<int32_t>(prompts.size());
  auto runner = MakeRunner(block_size, pool_blocks, 0, num_threads);
  BlockPool pool(pool_blocks);
  std::vector<TestSeq> seqs;
  seqs.reserve(prompts.size());
  for (const auto& p : prompts) seqs.emplace_back(p, block_size);
  for (;;) {
    StepBuilder sb(pool, max_blocks);
    bool any = false;
    for (TestSeq& s : seqs) {
      if (static_cast<int>(s.tokens.size()) - s.prompt_len >= max_new) continue;
      const int32_t pending = static_cast<int32_t>(s.tokens.size()) - s.cached;
      const int32_t n =
          s.cached < s.prompt_len && chunk_size > 0 ? std::min(pending, chunk_size) : pending;
      sb.Add(s, n);
      any = true;
    }
    if (!any) break;
    sb.RunGreedy(*runner);
  }
  std::vector<std::vector<int32_t>> out;
  for (const TestSeq& s : seqs) out.push_back(s.generated());
  return out;
}

std::vector<std::vector<int32_t>> EncodedPrompts() {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& p : EightPrompts()) out.push_back(Stories260kTok().Encode(p, true));
  return out;
}

TEST_CASE("Eight prompts batched in one BatchInput give exactly the tokens each gives alone",
          "[model]") {
  constexpr int kNew = 48;
  const auto prompts = EncodedPrompts();
  for (int bs : {1, 16}) {
    std::vector<std::vector<int32_t>> solo;
    for (const auto& p : prompts) solo.push_back(SoloGreedy(p, bs, kNew, /*stop_at_bos=*/false));
    for (const auto& s : solo) REQUIRE(s.size() == kNew);
    // The eight streams really differ.
    REQUIRE(solo[0] != solo[1]);
    DYNAMIC_SECTION("block size " << bs << ", whole prompts prefilled together, one thread") {
      REQUIRE(BatchedGreedy(prompts, bs, kNew, 0, 1) == solo);
    }
    DYNAMIC_SECTION("block size " << bs << ", whole prompts prefilled together, two threads") {
      REQUIRE(BatchedGreedy(prompts, bs, kNew, 0, 2) == solo);
    }
    DYNAMIC_SECTION("block size " << bs << ", prompts in chunks of 7 beside decoding rows") {
      // Short prompts finish prefill first and decode while the long ones
      // are still being prefilled, so most steps mix both kinds of rows.
      REQUIRE(BatchedGreedy(prompts, bs, kNew, 7, 2) == solo);
    }
  }
}

TEST_CASE("Sixty-four sequences decode in parallel rows exactly as alone", "[model]") {
  // Big enough (64 rows x dim 64) that the forward pass splits work over threads.
  const auto eight = EncodedPrompts();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 64; ++i) {
    std::vector<int32_t> p = eight[i % 8];
    p.push_back(3 + (i * 37) % 500);  // make each one different
    prompts.push_back(p);
  }
  auto batched = BatchedGreedy(prompts, 16, 24, 0, 2);
  for (int i : {0, 9, 37, 63}) {
    INFO("sequence " << i);
    REQUIRE(batched[i] == SoloGreedy(prompts[i], 16, 24, false));
  }
}

// Attention output of one query row over a sequence's cached K/V, through the
// runner: runs a decode step for `probe` token at position n with the given
// blocks and returns its logits.
std::vector<float> ProbeLogits(CpuModelRunner& runner, const std::vector<int32_t>& blocks,
                               int32_t n, int32_t token, BlockId scratch_block) {
  const int bs = runner.kv_format().block_size();
  BatchInput b;
  b.Clear();
  std::vector<int32_t> table = blocks;
  if (static_cast<int32_t>(table.size()) * bs <= n) table.push_back(scratch_block);
  b.max_blocks_per_seq = static_cast<int32_t>(table.size());
  b.block_table = table;
  b.token_ids = {token};
  b.positions = {n};
  b.slot_mapping = {int64_t{table[n / bs]} * bs + n % bs};
  b.query_start = {0, 1};
  b.context_len = {n + 1};
  b.logits_rows = {0};
  std::vector<float> logits(runner.config().vocab_size);
  REQUIRE(runner.Forward(b, logits).ok());
  return logits;
}

bool BlockBytesEqual(const HostKvPages& a, BlockId ia, const HostKvPages& b, BlockId ib) {
  for (int l = 0; l < a.num_layers(); ++l) {
    if (std::memcmp(a.block(l, ia), b.block(l, ib), a.format().block_bytes()) != 0) return false;
  }
  return true;
}

TEST_CASE("CopyBlocks, SwapOut and SwapIn move whole blocks of every layer", "[model]") {
  constexpr int kBs = 4;
  auto runner = MakeRunner(kBs, /*num_blocks=*/16, /*num_swap_blocks=*/8, 1);
  REQUIRE(runner->num_blocks() == 16);
  REQUIRE(runner->num_swap_blocks() == 8);
  BlockPool pool(16);
  // Prefill 10 tokens into blocks 0, 1, 2 (the last one part full).
  std::vector<int32_t> prompt =
      Stories260kTok().Encode("Once upon a time, there was a little girl named Lily. She", true);
  REQUIRE(prompt.size() >= 10);
  prompt.resize(10);
  TestSeq s(prompt, kBs);
  StepBuilder sb(pool, 8);
  sb.Add(s, 10);
  sb.RunGreedy(*runner);
  REQUIRE(s.table.blocks() == std::vector<BlockId>{0, 1, 2});
  const std::vector<float> reference = ProbeLogits(*runner, {0, 1, 2}, 10, s.tokens.back(), 2);

  SECTION("copy-on-write copies bytes exactly; attention over the copies gives the same logits") {
    const BlockCopy copies[] = {{0, 10}, {1, 11}, {2, 12}};
    REQUIRE(runner->CopyBlocks(copies).ok());
    for (const BlockCopy& c : copies) {
      REQUIRE(BlockBytesEqual(runner->primary_pages(), c.src, runner->primary_pages(), c.dst));
    }
    REQUIRE(ProbeLogits(*runner, {10, 11, 12}, 10, s.tokens.back(), 12) == reference);
  }
  SECTION("swap out, clobber, swap in to other blocks: the same logits") {
    const BlockCopy out[] = {{0, 5}, {1, 3}, {2, 7}};
    REQUIRE(runner->SwapOut(out).ok());
    for (const BlockCopy& c : out) {
      REQUIRE(BlockBytesEqual(runner->primary_pages(), c.src, runner->swap_pages(), c.dst));
    }
    // Another sequence overwrites the primary blocks.
    TestSeq other(Stories260kTok().Encode("The dog ran to the big tree and", true), kBs);
    BlockPool fresh(16);
    StepBuilder sb2(fresh, 8);
    sb2.Add(other, static_cast<int32_t>(other.tokens.size()));
    sb2.RunGreedy(*runner);
    REQUIRE(other.table.blocks()[0] == 0);
    REQUIRE_FALSE(BlockBytesEqual(runner->primary_pages(), 0, runner->swap_pages(), 5));
    const BlockCopy in[] = {{5, 13}, {3, 14}, {7, 15}};
    REQUIRE(runner->SwapIn(in).ok());
    for (const BlockCopy& c : in) {
      REQUIRE(BlockBytesEqual(runner->swap_pages(), c.src, runner->primary_pages(), c.dst));
    }
    REQUIRE(ProbeLogits(*runner, {13, 14, 15}, 10, s.tokens.back(), 15) == reference);
  }
}

TEST_CASE("Malformed batches are rejected before any K/V is written", "[model]") {
  auto runner = MakeRunner(16, 4, 0, 1);
  BatchInput b;
  b.Clear();
  b.token_ids = {1, 5};
  b.positions = {0, 1};
  b.slot_mapping = {0, 1};
  b.query_start = {0, 2};
  b.context_len = {2};
  b.block_table = {0};
  b.max_blocks_per_seq = 1;
  b.logits_rows = {1};
  std::vector<float> logits(512);
  REQUIRE(runner->Forward(b, logits).ok());
  auto expect_error = [&](BatchInput bad, const std::string& needle) {
    absl::Status st = runner->Forward(bad, logits);
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
    INFO(st.message());
    REQUIRE(std::string(st.message()).find(needle) != std::string::npos);
  };
  SECTION("token id outside the vocabulary") {
    BatchInput bad = b;
    bad.token_ids[1] = 512;
    expect_error(bad, "token_ids[1]");
  }
  SECTION("a negative position (past the RoPE table is fine: it is computed)") {
    BatchInput bad = b;
    bad.positions[0] = -1;
    expect_error(bad, "positions[0]");
    BatchInput far = b;
    far.positions = {5000, 5001};
    REQUIRE(runner->Forward(far, logits).ok());
  }
  SECTION("slot past the pool") {
    BatchInput bad = b;
    bad.slot_mapping[1] = 64;
    expect_error(bad, "slot_mapping[1]");
  }
  SECTION("block id past the pool") {
    BatchInput bad = b;
    bad.block_table[0] = 4;
    expect_error(bad, "block_table[0][0]");
  }
  SECTION("context shorter than the new rows") {
    BatchInput bad = b;
    bad.context_len[0] = 1;
    expect_error(bad, "context_len[0]");
  }
  SECTION("logits buffer too small") {
    std::vector<float> small(100);
    absl::Status st = runner->Forward(b, small);
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kvserve
