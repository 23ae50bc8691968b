#include "kernels/plan/attention_plan.h"

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

// One decode row per sequence, row r attending keys[r] keys (its cache
// index is keys[r] - 1): rows whose costs are exactly the given numbers.
BatchInput DecodeRows(const std::vector<int32_t>& keys) {
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = 1;
  for (int32_t k : keys) {
    b.query_start.push_back(b.query_start.back() + 1);
    b.context_len.push_back(k);
    b.block_table.push_back(0);
    b.token_ids.push_back(0);
    b.positions.push_back(k - 1);
    b.slot_mapping.push_back(0);
  }
  return b;
}

TEST_CASE("Row splits: a prefix cost that reaches a share exactly closes the part there",
          "[kernels][plan]") {
  // The part closes at the first row whose running cost reaches its share
  // (acc * parts >= total * part), so a prefix equal to a share ends there.
  struct Row {
    std::vector<int32_t> keys;
    int parts;
    int64_t overhead;
    std::vector<int32_t> bounds;
  };
  const Row table[] = {
      // Shares of 4: running sums 2, 4 | 6, 8.
      {{2, 2, 2, 2}, 2, 0, {0, 2, 4}},
      // Shares of 2 and 4: 1, 2 | 3, 4 | 5, 6.
      {{1, 1, 1, 1, 1, 1}, 3, 0, {0, 2, 4, 6}},
      // Share 5: 3, 5 | 6, 10.
      {{3, 2, 1, 4}, 2, 0, {0, 2, 4}},
      // Costs 2, 2, 4 (keys + overhead 1), share 4: 2, 4 | 8.
      {{1, 1, 3}, 2, 1, {0, 2, 3}},
      // No prefix lands on the share 3.5: 1, 2, 3, 4 | 5, 6, 7.
      {{1, 1, 1, 1, 1, 1, 1}, 2, 0, {0, 4, 7}},
      // One row outweighs two shares of 4: parts 1 and 2 both close after it.
      {{10, 1, 1}, 3, 0, {0, 1, 1, 3}},
      // Share 4.5 with overhead 2: 3, 6 | 9.
      {{1, 1, 1}, 2, 2, {0, 2, 3}},
  };
  for (const Row& row : table) {
    INFO("keys " << ::Catch::Detail::stringify(row.keys) << ", parts " << row.parts << ", overhead "
                 << row.overhead);
    const BatchInput batch = DecodeRows(row.keys);
    const BatchView v = ViewOf(batch);
    REQUIRE(SplitRowsByAttentionCost(v, 0, row.parts, row.overhead) == row.bounds);
  }
}

}  // namespace
}  // namespace kvserve
