#include "cache/sizing/memory_budget.h"

#include <catch2/catch.hpp>
#include <string>

#include "cache/kv_format.h"

namespace kvserve {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("Pool size comes from num_blocks or from a byte budget", "[cache]") {
  SECTION("an explicit block count wins") {
    REQUIRE(*PoolBlocksFromBudget(100, 1 << 30, 5, 4096) == 100);
  }
  SECTION("a byte budget holds whole blocks of every layer") {
    // stories260K: 4 kv heads x head_dim 8, fp32, 16-token blocks, 5 layers.
    absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kFp32, 4, 8, 16);
    REQUIRE(f.ok());
    REQUIRE(f->block_bytes() == 4096);
    REQUIRE(BytesPerBlock(5, f->block_bytes()) == 20480);
    REQUIRE(*PoolBlocksFromBudget(0, 1 << 20, 5, f->block_bytes()) == 51);
  }
  SECTION("bad budgets name the field") {
    REQUIRE(Message(PoolBlocksFromBudget(0, 0, 5, 4096).status()) ==
            "set cache.num_blocks or cache.memory_bytes");
    REQUIRE(Message(PoolBlocksFromBudget(-1, 0, 5, 4096).status()) ==
            "cache.num_blocks must not be negative, got -1");
    REQUIRE(Message(PoolBlocksFromBudget(0, 100, 5, 4096).status()) ==
            "cache.memory_bytes 100 is less than one block (20480 bytes over 5 layers)");
    REQUIRE(Message(PoolBlocksFromBudget(0, 100, 5, 4096, "swap").status()) ==
            "swap.memory_bytes 100 is less than one block (20480 bytes over 5 layers)");
  }
}

TEST_CASE("Start-up fails with numbers when max_model_len does not fit", "[cache]") {
  absl::Status s = CheckSequenceFits(4096, 16, 100);
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) == "max_model_len 4096 needs 256 blocks of 16 tokens; the pool has 100");
  REQUIRE(CheckSequenceFits(4096, 16, 256).ok());
  REQUIRE(Message(CheckSequenceFits(4097, 16, 256)) ==
          "max_model_len 4097 needs 257 blocks of 16 tokens; the pool has 256");
  REQUIRE(BlocksForTokens(1, 16) == 1);
  REQUIRE(BlocksForTokens(16, 16) == 1);
  REQUIRE(BlocksForTokens(17, 16) == 2);
}

}  // namespace
}  // namespace kvserve
