#include "cache/tier/block_value.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

namespace kvserve {
namespace {

struct Fixture {
  TierIdentity id{.model_fingerprint = 0x1111222233334444ull,
                  .kv_format = 0xABCDEF0012345678ull,
                  .block_size = 4,
                  .payload_bytes = 100};
  std::vector<int32_t> tokens{7, 8, 9, 10};
  std::vector<uint8_t> payload = [] {
    std::vector<uint8_t> p(100);
    std::iota(p.begin(), p.end(), uint8_t{3});
    return p;
  }();
  TierBlockKey key{.hash = 0x42, .parent = 0x41, .extra_key = 0x99, .tokens = tokens};
};

TEST_CASE("A block value round-trips with its payload after the header", "[cache][tier]") {
  Fixture f;
  const std::string v = EncodeBlockValue(f.id, f.key, f.payload);
  REQUIRE(static_cast<int64_t>(v.size()) == TierValueBytes(f.id));
  REQUIRE(TierHeaderBytes(4) == 68 + 16);
  const DecodedBlock d = DecodeBlockValue(v, f.id, f.key);
  REQUIRE(d.ok());
  REQUIRE(d.payload_offset == 84);
  REQUIRE(std::memcmp(v.data() + d.payload_offset, f.payload.data(), 100) == 0);
}

TEST_CASE("A block value is rejected by cause", "[cache][tier]") {
  Fixture f;
  const std::string v = EncodeBlockValue(f.id, f.key, f.payload);
  SECTION("truncated: one byte short, or shorter than a header") {
    REQUIRE(DecodeBlockValue(v.substr(0, v.size() - 1), f.id, f.key).reject ==
            TierReject::kTruncated);
    REQUIRE(DecodeBlockValue(v.substr(0, 10), f.id, f.key).reject == TierReject::kTruncated);
    REQUIRE(DecodeBlockValue("", f.id, f.key).reject == TierReject::kTruncated);
  }
  SECTION("corrupt: one payload bit flipped, a bad magic, or a byte too many") {
    std::string bad = v;
    bad[v.size() - 7] ^= 0x10;
    REQUIRE(DecodeBlockValue(bad, f.id, f.key).reject == TierReject::kCorrupt);
    bad = v;
    bad[0] = 'X';
    REQUIRE(DecodeBlockValue(bad, f.id, f.key).reject == TierReject::kCorrupt);
    REQUIRE(DecodeBlockValue(v + "z", f.id, f.key).reject == TierReject::kCorrupt);
    bad = v;
    bad[70] ^= 1;  // a token id
    REQUIRE(DecodeBlockValue(bad, f.id, f.key).reject == TierReject::kCorrupt);
  }
  SECTION("foreign: another model fingerprint, KV format or block size") {
    TierIdentity other = f.id;
    other.model_fingerprint ^= 1;
    REQUIRE(DecodeBlockValue(v, other, f.key).reject == TierReject::kForeign);
    other = f.id;
    other.kv_format ^= 1;
    REQUIRE(DecodeBlockValue(v, other, f.key).reject == TierReject::kForeign);
    other = f.id;
    other.block_size = 8;
    REQUIRE(DecodeBlockValue(v, other, f.key).reject == TierReject::kForeign);
  }
  SECTION("mismatch: another hash, parent, salt or tokens") {
    TierBlockKey k = f.key;
    k.hash ^= 1;
    REQUIRE(DecodeBlockValue(v, f.id, k).reject == TierReject::kMismatch);
    k = f.key;
    k.parent ^= 1;
    REQUIRE(DecodeBlockValue(v, f.id, k).reject == TierReject::kMismatch);
    k = f.key;
    k.extra_key = 0;
    REQUIRE(DecodeBlockValue(v, f.id, k).reject == TierReject::kMismatch);
    std::vector<int32_t> t = f.tokens;
    t[3] = 11;
    k = f.key;
    k.tokens = t;
    REQUIRE(DecodeBlockValue(v, f.id, k).reject == TierReject::kMismatch);
  }
}

TEST_CASE("Store keys name the layout version the model the format the block size and the hash",
          "[cache][tier]") {
  Fixture f;
  REQUIRE(TierStoreKey("kvs:", f.id, 0x42) ==
          "kvs:v1:1111222233334444:abcdef0012345678:4:0000000000000042");
  TierIdentity other = f.id;
  other.kv_format ^= 1;
  REQUIRE(TierStoreKey("kvs:", other, 0x42) != TierStoreKey("kvs:", f.id, 0x42));
}

TEST_CASE("The tier checksum sees every byte and every length", "[cache][tier]") {
  std::vector<uint8_t> bytes(97);
  std::iota(bytes.begin(), bytes.end(), uint8_t{0});
  const uint64_t h = TierChecksum(bytes.data(), bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] ^= 0x80;
    REQUIRE(TierChecksum(bytes.data(), bytes.size()) != h);
    bytes[i] ^= 0x80;
  }
  REQUIRE(TierChecksum(bytes.data(), 96) != h);
  REQUIRE(TierChecksum(bytes.data(), bytes.size(), 1) != h);
}

}  // namespace
}  // namespace kvserve
