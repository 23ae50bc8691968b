// SamplingBatch: the host packing of device sampling rows — validation
// naming the field, history stored only for rows whose penalties read it,
// and the exact byte layout of the one upload.
#include "kernels/plan/sampling_batch.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace kvserve {
namespace {

void RequireBad(const absl::Status& status, const std::string& field) {
  INFO(std::string(status.message()));
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(status.message()).find(field) != std::string::npos);
}

TEST_CASE("SamplingBatch packs rows, then the histories of penalized rows", "[kernels][sampling]") {
  SamplingBatch batch(100);
  SampleRowParams plain;
  plain.temperature = 0.0f;
  plain.seed = 7;
  SampleRowParams penalized;
  penalized.frequency_penalty = 0.5f;
  penalized.step = 3;
  REQUIRE(batch.AddRow(plain, {1, 2, 3}, {4}).ok());
  REQUIRE(batch.AddRow(penalized, {5, 6}, {7, 7, 8}).ok());
  SampleRowParams repeated;
  repeated.repetition_penalty = 1.2f;
  REQUIRE(batch.AddRow(repeated, {}, {9}).ok());

  REQUIRE(batch.num_rows() == 3);
  REQUIRE(batch.history() == std::vector<int32_t>{5, 6, 7, 7, 8, 9});
  const std::vector<SampleRowParams>& rows = batch.rows();
  SECTION("history ranges") {
    REQUIRE(rows[0].prompt_len == 0);  // no penalty: nothing stored
    REQUIRE(rows[0].output_len == 0);
    REQUIRE(rows[1].history_begin == 0);
    REQUIRE(rows[1].prompt_len == 2);
    REQUIRE(rows[1].output_len == 3);
    REQUIRE(rows[2].history_begin == 5);
    REQUIRE(rows[2].prompt_len == 0);
    REQUIRE(rows[2].output_len == 1);
    REQUIRE(rows[0].seed == 7);
    REQUIRE(rows[1].step == 3);
  }
  SECTION("the packed bytes: rows, then history") {
    REQUIRE(batch.HistoryByteOffset() == 3 * 64);
    REQUIRE(batch.PackedBytes() == 3 * 64 + 6 * 4);
    std::vector<uint8_t> bytes(batch.PackedBytes() + 1, 0xee);
    batch.PackInto(bytes.data());
    REQUIRE(std::memcmp(bytes.data(), rows.data(), 3 * 64) == 0);
    REQUIRE(std::memcmp(bytes.data() + 192, batch.history().data(), 24) == 0);
    REQUIRE(bytes.back() == 0xee);
  }
  SECTION("Clear empties both") {
    batch.Clear();
    REQUIRE(batch.num_rows() == 0);
    REQUIRE(batch.PackedBytes() == 0);
  }
}

TEST_CASE("SamplingBatch rejects bad rows naming the field", "[kernels][sampling]") {
  SamplingBatch batch(100);
  SampleRowParams p;
  SECTION("sampling parameters") {
    p.temperature = -1.0f;
    RequireBad(batch.AddRow(p, {}, {}), "temperature");
    p = {};
    p.top_p = 0.0f;
    RequireBad(batch.AddRow(p, {}, {}), "top_p");
    p = {};
    p.min_p = 1.0f;
    RequireBad(batch.AddRow(p, {}, {}), "min_p");
    p = {};
    p.repetition_penalty = 0.0f;
    RequireBad(batch.AddRow(p, {}, {}), "repetition_penalty");
    p = {};
    p.presence_penalty = INFINITY;
    RequireBad(batch.AddRow(p, {}, {}), "presence_penalty");
    p = {};
    p.num_top_logprobs = 21;
    RequireBad(batch.AddRow(p, {}, {}), "num_top_logprobs");
    REQUIRE(batch.num_rows() == 0);
  }
  SECTION("token ids are checked when a penalty reads them") {
    p.presence_penalty = 0.1f;
    RequireBad(batch.AddRow(p, {1, 100}, {}), "prompt[1]");
    RequireBad(batch.AddRow(p, {}, {-1}), "output[0]");
    REQUIRE(batch.num_rows() == 0);
    REQUIRE(batch.history().empty());
    p.presence_penalty = 0.0f;  // not read: not checked, not stored
    REQUIRE(batch.AddRow(p, {1, 100}, {-1}).ok());
    REQUIRE(batch.history().empty());
  }
  SECTION("the vocabulary size") {
    SamplingBatch too_big(kMaxSampleVocab + 1);
    RequireBad(too_big.AddRow(p, {}, {}), "vocab");
  }
}

}  // namespace
}  // namespace kvserve
