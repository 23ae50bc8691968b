// int4_kc and int2_kc through CpuModelRunner on stories260K: a row's logits do not depend
// on how its sequence was cut into steps (prefill at once, in chunks, token
// by token), per-layer formats, tails moved by the runner's copies (extended
// ids), and the batch and option errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/loader/llama2c_loader.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/stories260k.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Stories260k;

std::vector<int32_t> Prompt() {
  static const std::vector<int32_t> p = testing::LilyPrompt();
  return p;
}

std::unique_ptr<CpuModelRunner> MakeRunner(const std::string& dtype, int block_size = 16,
                                           int32_t num_swap_blocks = 0, int threads = 1) {
  CpuRunnerOptions opt;
  opt.kv_dtype = *KvDtypeSpec::Parse(dtype);
  opt.block_size = block_size;
  opt.num_blocks = 40;
  opt.num_swap_blocks = num_swap_blocks;
  opt.num_threads = threads;
  auto r = CpuModelRunner::Create(Stories260k(), opt);
  REQUIRE(r.ok());
  return std::move(*r);
}

// One sequence in blocks first_block, first_block + 1, ... and tail `tail`:
// the step of rows [begin, end), logits of every row.
absl::Status Step(CpuModelRunner& r, const std::vector<int32_t>& tokens, int32_t begin, int32_t end,
                  int32_t tail, BlockId first_block, std::vector<float>* logits) {
  const int bs = r.kv_format().block_size();
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = (end + bs - 1) / bs;
  for (int i = 0; i < b.max_blocks_per_seq; ++i) b.block_table.push_back(first_block + i);
  for (int32_t i = begin; i < end; ++i) {
    b.token_ids.push_back(tokens[i]);
    b.positions.push_back(i);
    b.slot_mapping.push_back(int64_t{first_block + i / bs} * bs + i % bs);
    b.logits_rows.push_back(i - begin);
  }
  b.query_start = {0, end - begin};
  b.context_len = {end};
  b.tail_ids = {tail};
  logits->resize(b.logits_rows.size() * r.config().vocab_size);
  return r.Forward(b, *logits);
}

// Every row's logits over `tokens`, in steps of `chunk` rows.
std::vector<float> AllLogits(CpuModelRunner& r, const std::vector<int32_t>& tokens, int chunk) {
  std::vector<float> all, step;
  const int32_t n = static_cast<int32_t>(tokens.size());
  for (int32_t begin = 0; begin < n; begin += chunk) {
    REQUIRE(Step(r, tokens, begin, std::min(n, begin + chunk), 0, 0, &step).ok());
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

TEST_CASE("int4_kc and int2_kc logits do not depend on how a sequence is cut into steps",
          "[model]") {
  const std::vector<int32_t> tokens = Prompt();
  REQUIRE(tokens.size() > 40);
  for (const char* dtype : {"int4_kc", "int8,int4_kc*,int8", "int2_kc", "int4_kc,int2_kc*"}) {
    for (int bs : {16, 32}) {
      DYNAMIC_SECTION(dtype << ", block size " << bs) {
        auto r = MakeRunner(dtype, bs, 0, 2);
        const std::vector<float> whole = AllLogits(*r, tokens, static_cast<int>(tokens.size()));
        REQUIRE(AllLogits(*r, tokens, 7) == whole);
        REQUIRE(AllLogits(*r, tokens, 1) == whole);
        REQUIRE(AllLogits(*r, tokens, bs) == whole);
        // And it is a different cache from fp32: it does quantize.
        auto fp32 = MakeRunner("fp32", bs);
        REQUIRE(AllLogits(*fp32, tokens, 64) != whole);
      }
    }
  }
}

TEST_CASE("Per-layer KV dtypes give each layer its own page format", "[model]") {
  const KvDtype kc = GENERATE(KvDtype::kInt4Kc, KvDtype::kInt2Kc);
  auto r = MakeRunner(absl::StrCat("int8,", std::string(KvDtypeName(kc)), "*,int8"), 16, 8);
  const HostKvPages& pages = r->primary_pages();
  REQUIRE(pages.num_layers() == 5);
  REQUIRE(pages.format(0).dtype() == KvDtype::kInt8);
  for (int l = 1; l < 4; ++l) REQUIRE(pages.format(l).dtype() == kc);
  REQUIRE(pages.format(4).dtype() == KvDtype::kInt8);
  REQUIRE(r->kv_format().dtype() == KvDtype::kInt8);  // layer 0's
  REQUIRE(r->num_tail_blocks() == CpuModelRunner::kDefaultTailBlocks);
  REQUIRE(r->num_swap_tail_blocks() == CpuModelRunner::kDefaultTailBlocks);
  REQUIRE(pages.tails(0) == nullptr);  // int8 layers keep no tails
  REQUIRE(pages.tails(1) != nullptr);
  REQUIRE(pages.bytes_per_block() ==
          2 * pages.format(0).block_bytes() + 3 * pages.format(1).block_bytes());
  auto plain = MakeRunner("int8", 16, 8);
  REQUIRE(plain->num_tail_blocks() == 0);
  REQUIRE(plain->num_swap_tail_blocks() == 0);
}

TEST_CASE("int4_kc and int2_kc runner options and batches are checked", "[model]") {
  const char* dtype = GENERATE("int4_kc", "int2_kc");
  INFO(dtype);
  SECTION("blocks under 16 tokens are refused, naming cache.block_size") {
    for (KvDtype d : {KvDtype::kInt4Kc, KvDtype::kInt2Kc}) {
      CpuRunnerOptions opt;
      opt.kv_dtype = d;
      opt.block_size = 8;
      auto r = CpuModelRunner::Create(Stories260k(), opt);
      REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(std::string(r.status().message()).find("cache.block_size") != std::string::npos);
    }
  }
  SECTION("a per-layer list that does not fit the model names cache.kv_dtype") {
    CpuRunnerOptions opt;
    opt.kv_dtype = *KvDtypeSpec::Parse("int8*2,int4_kc*2");
    auto r = CpuModelRunner::Create(Stories260k(), opt);
    REQUIRE(std::string(r.status().message()).find("cache.kv_dtype") != std::string::npos);
  }
  auto r = MakeRunner(dtype);
  const std::vector<int32_t> tokens = Prompt();
  std::vector<float> logits;
  REQUIRE(Step(*r, tokens, 0, 10, 0, 0, &logits).ok());
  auto expect_error = [&](BatchInput bad, const std::string& needle) {
    std::vector<float> out(bad.logits_rows.size() * 512);
    absl::Status st = r->Forward(bad, out);
    INFO(st.message());
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(st.message()).find(needle) != std::string::npos);
  };
  BatchInput b;
  b.Clear();
  b.token_ids = {tokens[10], 7};
  b.positions = {10, 0};
  b.slot_mapping = {10, 16};
  b.query_start = {0, 1, 2};
  b.context_len = {11, 1};
  b.block_table = {0, 1};
  b.max_blocks_per_seq = 1;
  b.logits_rows = {0, 1};
  b.tail_ids = {0, 1};
  {
    std::vector<float> out(2 * 512);
    REQUIRE(r->Forward(b, out).ok());
  }
  SECTION("no tail ids") {
    BatchInput bad = b;
    bad.tail_ids.clear();
    expect_error(bad, "tail_ids has 0 entries");
  }
  SECTION("a partial block without a tail") {
    BatchInput bad = b;
    bad.tail_ids[0] = -1;
    expect_error(bad, "tail_ids[0] = -1");
  }
  SECTION("a tail past the pool") {
    BatchInput bad = b;
    bad.tail_ids[1] = CpuModelRunner::kDefaultTailBlocks;
    expect_error(bad, "tail_ids[1] = 128");
  }
  SECTION("two sequences writing one tail") {
    BatchInput bad = b;
    bad.tail_ids[1] = 0;
    expect_error(bad, "the same tail");
  }
}

bool TailBytesEqual(const HostKvPages& a, int32_t ta, const HostKvPages& b, int32_t tb) {
  for (int l = 0; l < a.num_layers(); ++l) {
    const int64_t n = a.format(l).tail_block_bytes();
    if (n > 0 && std::memcmp(a.tail(l, ta), b.tail(l, tb), n) != 0) return false;
  }
  return true;
}

TEST_CASE("CopyBlocks, SwapOut and SwapIn move tails named by extended ids", "[model]") {
  // 40 primary blocks, so primary tail t is id 40 + t; 8 swap blocks, so host
  // tail t is id 8 + t.
  auto r = MakeRunner(GENERATE("int8,int4_kc*,int8", "int8,int2_kc*,int8"), 16, 8);
  const std::vector<int32_t> tokens = Prompt();
  std::vector<float> logits;
  // 20 tokens: block 0 full, rows 16..19 in tail 0.
  REQUIRE(Step(*r, tokens, 0, 20, 0, 0, &logits).ok());
  std::vector<float> reference;
  REQUIRE(Step(*r, tokens, 20, 21, 0, 0, &reference).ok());
  // Tail 0 now holds rows 16..20; redo the probe from the state before it.
  REQUIRE(Step(*r, tokens, 0, 20, 0, 0, &logits).ok());

  SECTION("copy-on-write of a tail: the same logits from the copy") {
    const BlockCopy copies[] = {{0, 2}, {1, 3}, {40 + 0, 40 + 5}};  // int8 layers use block 1
    REQUIRE_FALSE(TailBytesEqual(r->primary_pages(), 0, r->primary_pages(), 5));
    REQUIRE(r->CopyBlocks(copies).ok());
    REQUIRE(TailBytesEqual(r->primary_pages(), 0, r->primary_pages(), 5));
    std::vector<float> probe;
    REQUIRE(Step(*r, tokens, 20, 21, 5, 2, &probe).ok());
    REQUIRE(probe == reference);
  }
  SECTION("swap out, clobber, swap in to another tail: the same logits") {
    const BlockCopy out[] = {{0, 3}, {1, 4}, {40 + 0, 8 + 1}};
    REQUIRE(r->SwapOut(out).ok());
    REQUIRE(TailBytesEqual(r->primary_pages(), 0, r->swap_pages(), 1));
    std::vector<float> other;
    REQUIRE(Step(*r, std::vector<int32_t>(30, 9), 0, 30, 0, 0, &other).ok());  // clobbers tail 0
    REQUIRE_FALSE(TailBytesEqual(r->primary_pages(), 0, r->swap_pages(), 1));
    const BlockCopy in[] = {{3, 10}, {4, 11}, {8 + 1, 40 + 7}};
    REQUIRE(r->SwapIn(in).ok());
    std::vector<float> probe;
    REQUIRE(Step(*r, tokens, 20, 21, 7, 10, &probe).ok());
    REQUIRE(probe == reference);
  }
}

}  // namespace
}  // namespace kvserve
