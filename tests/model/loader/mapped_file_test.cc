#include "model/loader/mapped_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/loader/llama2c_loader.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = testing::MakeTempDir("mapped-file") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST_CASE("A file is read into memory by default, mmapped on request, the same bytes", "[model]") {
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  const std::string path = WriteFile("weights.bin", bytes);
  auto read = MappedFile::Open(path);
  auto mapped = MappedFile::Open(path, FileAccess::kMmap);
  REQUIRE(read.ok());
  REQUIRE(mapped.ok());
  REQUIRE((*read)->size() == bytes.size());
  REQUIRE(std::memcmp((*read)->data(), bytes.data(), bytes.size()) == 0);
  REQUIRE(std::memcmp((*mapped)->data(), bytes.data(), bytes.size()) == 0);

  SECTION("the read copy outlives a truncation of the file") {
    REQUIRE(truncate(path.c_str(), 0) == 0);
    REQUIRE(std::memcmp((*read)->data(), bytes.data(), bytes.size()) == 0);
  }
}

TEST_CASE("The fingerprint is stable and changes with any byte", "[model]") {
  std::string bytes(4099, 'w');
  const uint64_t base =
      FingerprintBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  REQUIRE(FingerprintBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == base);
  // A byte in the 32-byte lanes, in the 8-byte tail and in the last bytes.
  for (size_t at : {size_t{0}, size_t{31}, size_t{4090}, size_t{4098}}) {
    INFO(at);
    std::string changed = bytes;
    changed[at] ^= 1;
    REQUIRE(FingerprintBytes(reinterpret_cast<const uint8_t*>(changed.data()), changed.size()) !=
            base);
  }
  // Length counts: a prefix is not the whole.
  REQUIRE(FingerprintBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() - 1) !=
          base);
  REQUIRE(FingerprintHex(0x0123456789abcdefull) == "0123456789abcdef");
  REQUIRE(FingerprintHex(1) == "0000000000000001");
}

TEST_CASE("stories260K has one fingerprint whether read or mmapped", "[model]") {
  auto read = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  auto mapped = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint(), FileAccess::kMmap);
  REQUIRE(read.ok());
  REQUIRE(mapped.ok());
  REQUIRE(read->fingerprint.size() == 16);
  REQUIRE(read->fingerprint == mapped->fingerprint);
}

}  // namespace
}  // namespace kvserve
