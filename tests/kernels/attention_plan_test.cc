#include "kernels/attention_plan.h"

#include <catch2/catch.hpp>
#include <vector>

#include "kernels/batch_input.h"
#include "kernels/paged_view.h"

namespace kvserve {
namespace {

// Three sequences: a 5-row prefill chunk after a 3-token prefix, one decode
// row at index 9, a sequence with no rows this step, and a 2-row chunk.
BatchInput MixedBatch() {
  BatchInput b;
  b.Clear();
  b.query_start = {0, 5, 6, 6, 8};
  b.context_len = {8, 10, 4, 2};
  b.max_blocks_per_seq = 3;
  b.block_table = {7, 2, -1, 4, 0, 9, 5, -1, -1, 1, -1, -1};
  b.token_ids.assign(8, 0);
  b.positions = {3, 4, 5, 6, 7, 9, 0, 1};
  b.slot_mapping.assign(8, 0);
  return b;
}

TEST_CASE("BatchView: rows, cache indices, slots", "[kernels][plan]") {
  BatchInput batch = MixedBatch();
  const BatchView v = ViewOf(batch);
  REQUIRE(v.num_tokens == 8);
  REQUIRE(v.num_seqs == 4);
  const std::vector<int32_t> seq_of = {0, 0, 0, 0, 0, 1, 3, 3};
  for (int32_t r = 0; r < 8; ++r) REQUIRE(v.SeqOfRow(r) == seq_of[r]);
  REQUIRE(v.QueryLen(2) == 0);
  REQUIRE(v.FirstIndex(0) == 3);
  REQUIRE(v.CacheIndex(0, 4) == 7);
  REQUIRE(v.CacheIndex(1, 5) == 9);
  REQUIRE(v.CacheIndex(3, 7) == 1);
  // Block size 4: sequence 1's table is {4, 0, 9}; index 9 is block 2, offset 1.
  REQUIRE(v.Slot(1, 9, 4) == 9 * 4 + 1);
  REQUIRE(v.Slot(0, 5, 4) == 2 * 4 + 1);
  REQUIRE(v.BlockRow(3)[0] == 1);
}

TEST_CASE("KeyBegin and NumKeys honour the sliding window", "[kernels][plan]") {
  REQUIRE(KeyBegin(0, 0) == 0);
  REQUIRE(KeyBegin(100, 0) == 0);
  REQUIRE(KeyBegin(100, 4) == 97);
  REQUIRE(KeyBegin(2, 4) == 0);
  REQUIRE(NumKeys(100, 4) == 4);
  REQUIRE(NumKeys(2, 4) == 3);
  REQUIRE(NumKeys(9, 0) == 10);
}

TEST_CASE("Attention cost: key counts and balanced row splits", "[kernels][plan]") {
  BatchInput batch = MixedBatch();
  const BatchView v = ViewOf(batch);
  // Rows attend 4,5,6,7,8 (seq 0), 10 (seq 1), 1,2 (seq 3) keys.
  REQUIRE(CountAttentionKeys(v, 0) == 4 + 5 + 6 + 7 + 8 + 10 + 1 + 2);
  // Window 3 caps every row at 3 keys.
  REQUIRE(CountAttentionKeys(v, 3) == 3 * 5 + 3 + 1 + 2);

  SECTION("one part is the whole range") {
    REQUIRE(SplitRowsByAttentionCost(v, 0, 1, 0) == std::vector<int32_t>{0, 8});
  }
  SECTION("two parts cut where half the cost is reached") {
    // Costs 4,5,6,7,8,10,1,2 (total 43): the running sum reaches 21.5 at row 3.
    REQUIRE(SplitRowsByAttentionCost(v, 0, 2, 0) == std::vector<int32_t>{0, 4, 8});
  }
  SECTION("per-row overhead moves the cut towards equal row counts") {
    // Costs +100 each: total 843, the half is reached at row 3 (4 rows, 422).
    REQUIRE(SplitRowsByAttentionCost(v, 0, 2, 100) == std::vector<int32_t>{0, 4, 8});
    // Four shares of 210.75: running sums 104, 209, 315 | 422 | 530, 640 | 741, 843.
    REQUIRE(SplitRowsByAttentionCost(v, 0, 4, 100) == std::vector<int32_t>{0, 3, 4, 6, 8});
  }
  SECTION("more parts than rows are clamped") {
    std::vector<int32_t> b = SplitRowsByAttentionCost(v, 0, 50, 0);
    REQUIRE(b.size() == 9);
    REQUIRE(b.front() == 0);
    REQUIRE(b.back() == 8);
    for (size_t i = 1; i < b.size(); ++i) REQUIRE(b[i] >= b[i - 1]);
  }
}

}  // namespace
}  // namespace kvserve
