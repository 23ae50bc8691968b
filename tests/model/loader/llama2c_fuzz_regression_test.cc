// Inputs that tests/fuzz/llama2c_header_fuzz.cc found crashing (or that
// would have exhausted memory) the llama2.c reader, as regression tests.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "model/loader/llama2c_loader.h"
#include "model/loader/mapped_file.h"

namespace kvserve {
namespace {

// A legacy checkpoint: the 7-int32 header, then `floats` weights of 0.25.
std::string LegacyFile(const std::vector<int32_t>& header, size_t floats) {
  std::string bytes(header.size() * 4 + floats * 4, '\0');
  std::memcpy(bytes.data(), header.data(), header.size() * 4);
  const float quarter = 0.25f;
  for (size_t i = 0; i < floats; ++i) std::memcpy(&bytes[header.size() * 4 + i * 4], &quarter, 4);
  return bytes;
}

TEST_CASE("A llama2.c header with vocab_size INT32_MIN is refused, not negated", "[model]") {
  // Found by the fuzzer: -vocab_size overflowed (UBSan) before any check.
  const int32_t kMin = std::numeric_limits<int32_t>::min();
  auto w = LoadLlama2cCheckpoint(
      MappedFile::FromBytes("fuzz.bin", LegacyFile({8, 16, 1, 2, 2, kMin, 4}, 64)));
  REQUIRE(w.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(w.status().message() ==
          "fuzz.bin: bad llama2.c header: vocab_size -2147483648 is out of range");
}

TEST_CASE("A llama2.c header's num_layers allocates nothing the file does not hold", "[model]") {
  // 2^31 - 1 layers on a 168-byte file: the reader used to size the layer
  // array from the header first (about 1 TB) and died of it.
  const int32_t kMax = std::numeric_limits<int32_t>::max();
  auto w = LoadLlama2cCheckpoint(
      MappedFile::FromBytes("fuzz.bin", LegacyFile({8, 16, kMax, 2, 2, 4, 4}, 4 * 8 + 3)));
  REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(w.status().message() ==
          "fuzz.bin: truncated checkpoint: tensor 'rms_att_weight' needs bytes 156..188 but the "
          "file has 168");
}

TEST_CASE("A llama2.c checkpoint read from bytes matches the header", "[model]") {
  // The fuzzer's seed shape: dim 8, hidden 16, 1 layer, 2 heads, vocab 4,
  // seq 4, with the RoPE tables of the legacy format.
  const size_t floats = 4 * 8 + 8 + 64 + 2 * 64 + 64 + 8 + 3 * 128 + 8 + 2 * 4 * 2;
  auto w = LoadLlama2cCheckpoint(
      MappedFile::FromBytes("tiny.bin", LegacyFile({8, 16, 1, 2, 2, 4, 4}, floats)));
  REQUIRE(w.ok());
  REQUIRE(w->config.name == "tiny");
  REQUIRE(w->layers.size() == 1);
  REQUIRE(w->tok_embeddings.shape == std::vector<int64_t>{4, 8});
  REQUIRE(w->output.data == w->tok_embeddings.data);
  REQUIRE(w->layers[0].w_up.shape == std::vector<int64_t>{16, 8});
  REQUIRE(w->layers[0].w_up.data[0] == 0.25f);

  SECTION("one float short is truncated, naming the RoPE table") {
    auto cut = LoadLlama2cCheckpoint(
        MappedFile::FromBytes("tiny.bin", LegacyFile({8, 16, 1, 2, 2, 4, 4}, floats - 1)));
    REQUIRE(cut.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(cut.status().message() ==
            "tiny.bin: truncated checkpoint: tensor 'freq_cis_imag' needs bytes 2844..2876 but "
            "the file has 2872");
  }
}

}  // namespace
}  // namespace kvserve
