// The CUDA runner's upload layout, checked byte for byte on the host: where
// each section lands, how a decode step is padded to its graph bucket, and
// what does not fit.
#include "model/cuda/host/batch_staging.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace kvserve {
namespace {

template <typename T>
std::vector<T> Read(const std::vector<uint8_t>& buf, const StagingRange& r, int64_t count) {
  REQUIRE(r.bytes == count * static_cast<int64_t>(sizeof(T)));
  std::vector<T> out(count);
  std::memcpy(out.data(), buf.data() + r.offset, r.bytes);
  return out;
}

// Two decoding sequences (contexts 5 and 18, block size 16) as the engine builds them.
BatchInput TwoDecodes() {
  BatchInput b;
  b.Clear();
  b.token_ids = {7, 9};
  b.positions = {4, 17};
  b.slot_mapping = {3 * 16 + 4, 5 * 16 + 1};
  b.query_start = {0, 1, 2};
  b.context_len = {5, 18};
  b.max_blocks_per_seq = 2;
  b.block_table = {3, 0, 4, 5};
  b.logits_rows = {0, 1};
  return b;
}

TEST_CASE("Staging layout: every section aligned, the batch part first", "[model]") {
  StagingShape s;
  s.num_tokens = 5;
  s.num_seqs = 2;
  s.block_table_stride = 3;
  s.num_logits_rows = 2;
  s.attention_words = 12;
  const StagingLayout l = PlanStaging(s);
  REQUIRE(l.token_ids.offset == 0);
  REQUIRE(l.token_ids.bytes == 20);
  REQUIRE(l.positions.offset == 32);
  REQUIRE(l.slot_mapping.offset == 64);
  REQUIRE(l.slot_mapping.bytes == 40);
  REQUIRE(l.query_start.offset == 112);
  REQUIRE(l.query_start.bytes == 12);
  REQUIRE(l.context_len.offset == 128);
  REQUIRE(l.block_table.offset == 144);
  REQUIRE(l.block_table.bytes == 24);
  REQUIRE(l.logits_rows.offset == 176);
  REQUIRE(l.tail_ids.offset == 192);
  REQUIRE(l.tail_ids.bytes == 8);
  REQUIRE(l.attention.offset == 208);
  REQUIRE(l.attention.bytes == 48);
  REQUIRE(l.total_bytes == 256);
  // Same shape, same layout (what a replayed graph relies on).
  REQUIRE(PlanStaging(s).attention.offset == l.attention.offset);
}

TEST_CASE("An eager step is staged as it is", "[model]") {
  const BatchInput b = TwoDecodes();
  const std::vector<int32_t> words = {1, 2, 3, 4};
  const StagingLayout l = PlanStaging(ShapeOfBatch(b, 4));
  std::vector<uint8_t> buf(l.total_bytes + 16, 0xAB);
  REQUIRE(FillBatchStaging(b, words, l, buf).ok());
  REQUIRE(Read<int32_t>(buf, l.token_ids, 2) == b.token_ids);
  REQUIRE(Read<int32_t>(buf, l.positions, 2) == b.positions);
  REQUIRE(Read<int64_t>(buf, l.slot_mapping, 2) == b.slot_mapping);
  REQUIRE(Read<int32_t>(buf, l.query_start, 3) == b.query_start);
  REQUIRE(Read<int32_t>(buf, l.context_len, 2) == b.context_len);
  REQUIRE(Read<int32_t>(buf, l.block_table, 4) == b.block_table);
  REQUIRE(Read<int32_t>(buf, l.logits_rows, 2) == b.logits_rows);
  REQUIRE(Read<int32_t>(buf, l.tail_ids, 2) == std::vector<int32_t>{-1, -1});  // none given
  REQUIRE(Read<int32_t>(buf, l.attention, 4) == words);
  // Gaps between sections are zero; bytes past the layout are not touched.
  REQUIRE(buf[l.token_ids.offset + 8] == 0);
  REQUIRE(buf[l.total_bytes] == 0xAB);
}

TEST_CASE("A decode step is padded to its graph bucket", "[model]") {
  const BatchInput b = TwoDecodes();
  REQUIRE(IsPureDecode(b));
  const std::vector<int32_t> words = {5, 6, 7};
  const StagingLayout l = PlanStaging(PaddedDecodeShape(4, /*max_blocks_per_seq=*/3, 8));
  std::vector<uint8_t> buf(l.total_bytes, 0xAB);
  REQUIRE(FillBatchStaging(b, words, l, buf).ok());
  REQUIRE(Read<int32_t>(buf, l.token_ids, 4) == std::vector<int32_t>{7, 9, 0, 0});
  REQUIRE(Read<int32_t>(buf, l.positions, 4) == std::vector<int32_t>{4, 17, 0, 0});
  REQUIRE(Read<int64_t>(buf, l.slot_mapping, 4) == std::vector<int64_t>{52, 81, -1, -1});
  REQUIRE(Read<int32_t>(buf, l.query_start, 5) == std::vector<int32_t>{0, 1, 2, 3, 4});
  REQUIRE(Read<int32_t>(buf, l.context_len, 4) == std::vector<int32_t>{5, 18, 1, 1});
  // Rows re-strided from 2 to 3 entries; padding rows are block 0.
  REQUIRE(Read<int32_t>(buf, l.block_table, 12) ==
          std::vector<int32_t>{3, 0, 0, 4, 5, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE(Read<int32_t>(buf, l.logits_rows, 4) == std::vector<int32_t>{0, 1, 2, 3});
  REQUIRE(Read<int32_t>(buf, l.attention, 8) == std::vector<int32_t>{5, 6, 7, 0, 0, 0, 0, 0});
  REQUIRE(Read<int32_t>(buf, l.tail_ids, 4) == std::vector<int32_t>{-1, -1, -1, -1});
}

TEST_CASE("int4_kc tail ids are staged per sequence, padding sequences have none", "[model]") {
  BatchInput b = TwoDecodes();
  b.tail_ids = {3, -1};
  const StagingLayout l = PlanStaging(PaddedDecodeShape(4, /*max_blocks_per_seq=*/3, 8));
  std::vector<uint8_t> buf(l.total_bytes, 0xAB);
  REQUIRE(FillBatchStaging(b, {}, l, buf).ok());
  REQUIRE(Read<int32_t>(buf, l.tail_ids, 4) == std::vector<int32_t>{3, -1, -1, -1});
  b.tail_ids = {3};
  const absl::Status s = FillBatchStaging(b, {}, l, buf);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(s.message()).find("tail_ids") != std::string::npos);
}

TEST_CASE("Pure decode: one row per sequence, every row wants logits", "[model]") {
  BatchInput b = TwoDecodes();
  REQUIRE(IsPureDecode(b));
  b.logits_rows = {1};
  REQUIRE_FALSE(IsPureDecode(b));
  BatchInput prefill = TwoDecodes();
  prefill.token_ids.push_back(3);
  prefill.positions.push_back(18);
  prefill.slot_mapping.push_back(5 * 16 + 2);
  prefill.query_start = {0, 1, 3};
  prefill.context_len = {5, 19};
  prefill.logits_rows = {0, 2};
  REQUIRE_FALSE(IsPureDecode(prefill));
  BatchInput empty;
  empty.Clear();
  REQUIRE_FALSE(IsPureDecode(empty));
}

TEST_CASE("What does not fit the layout is refused, naming it", "[model]") {
  const BatchInput b = TwoDecodes();
  auto fill = [&](const StagingShape& s, std::vector<int32_t> words = {}) {
    const StagingLayout l = PlanStaging(s);
    std::vector<uint8_t> buf(l.total_bytes);
    return std::string(FillBatchStaging(b, words, l, buf).message());
  };
  REQUIRE(fill(PaddedDecodeShape(1, 2, 0)) ==
          "batch staging: num_tokens is 2, the layout has room for 1");
  REQUIRE(fill(PaddedDecodeShape(2, 1, 0)) ==
          "batch staging: max_blocks_per_seq is 2, the layout has room for 1");
  REQUIRE(fill(PaddedDecodeShape(2, 2, 1), {1, 2}) ==
          "batch staging: the attention plan's word count is 2, the layout has room for 1");
  StagingShape s = PaddedDecodeShape(4, 2, 0);
  s.num_seqs = 3;
  REQUIRE(fill(s) ==
          "batch staging: 2 padding rows for 1 padding sequences; each padding sequence has "
          "exactly one row");
  const StagingLayout l = PlanStaging(PaddedDecodeShape(2, 2, 0));
  std::vector<uint8_t> small(l.total_bytes - 1);
  REQUIRE(!FillBatchStaging(b, {}, l, small).ok());
}

}  // namespace
}  // namespace kvserve
