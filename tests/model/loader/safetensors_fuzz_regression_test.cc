// Safetensors headers that tests/fuzz/safetensors_fuzz.cc showed to be
// mishandled, as regression tests: a shape whose byte size wrapped around 64
// bits matched a tiny data span, so the header was accepted and ReadFp32
// either threw std::length_error (unaligned data) or handed out a view of
// 2^62 floats over 0 bytes (aligned).
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>

#include "model/loader/mapped_file.h"
#include "model/loader/safetensors.h"

namespace kvserve {
namespace {

// A safetensors file: the 8-byte header length, the header, `data`.
std::string File(const std::string& header, const std::string& data = "") {
  const uint64_t n = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  return bytes + header + data;
}

TEST_CASE("A safetensors shape whose byte size overflows 64 bits is refused", "[model]") {
  // 2^62 F32 elements are 2^64 bytes: 0 in 64-bit arithmetic.
  const std::string entry = R"("w": {"dtype": "F32", "shape": [4611686018427387904], )"
                            R"("data_offsets": [0, 0]})";
  const std::string want =
      "fuzz.safetensors: tensor 'w': shape [4611686018427387904] of dtype F32 needs more than "
      "2^64 bytes but data_offsets [0, 0] span 0";
  SECTION("data section aligned") {
    const std::string header = "{" + entry + " }";
    REQUIRE(header.size() % 4 == 0);
    auto st = SafetensorsFile::Open(MappedFile::FromBytes("fuzz.safetensors", File(header)));
    REQUIRE(st.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(st.status().message() == want);
  }
  SECTION("data section unaligned") {
    const std::string header = "{" + entry + "}";
    REQUIRE(header.size() % 4 != 0);
    auto st = SafetensorsFile::Open(MappedFile::FromBytes("fuzz.safetensors", File(header)));
    REQUIRE(st.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(st.status().message() == want);
  }
  SECTION("2^61 I64 elements (2^64 bytes) too") {
    auto st = SafetensorsFile::Open(MappedFile::FromBytes(
        "fuzz.safetensors",
        File(
            R"({"b": {"dtype": "I64", "shape": [2, 1152921504606846976], "data_offsets": [0, 0]}})")));
    REQUIRE(st.status().message() ==
            "fuzz.safetensors: tensor 'b': shape [2, 1152921504606846976] of dtype I64 needs more "
            "than 2^64 bytes but data_offsets [0, 0] span 0");
  }
}

TEST_CASE("A safetensors file read from bytes gives its tensors", "[model]") {
  const float values[2] = {1.5f, -2.0f};
  std::string data(8, '\0');
  std::memcpy(data.data(), values, 8);
  auto st = SafetensorsFile::Open(MappedFile::FromBytes(
      "mem.safetensors",
      File(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", data)));
  REQUIRE(st.ok());
  REQUIRE((*st)->path() == "mem.safetensors");
  std::vector<float> converted;
  auto t = (*st)->ReadFp32("w", &converted);
  REQUIRE(t.ok());
  REQUIRE(t->shape == std::vector<int64_t>{2});
  REQUIRE(t->data[0] == 1.5f);
  REQUIRE(t->data[1] == -2.0f);
}

}  // namespace
}  // namespace kvserve
