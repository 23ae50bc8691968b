#include "cache/tier/block_value.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'T', 'B'};
// Field offsets of the header.
constexpr size_t kOffVersion = 4;
constexpr size_t kOffModel = 8;
constexpr size_t kOffFormat = 16;
constexpr size_t kOffBlockSize = 24;
constexpr size_t kOffPayloadBytes = 28;
constexpr size_t kOffHash = 36;
constexpr size_t kOffParent = 44;
constexpr size_t kOffExtra = 52;
constexpr size_t kOffChecksum = 60;
constexpr size_t kFixedBytes = 68;

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;

constexpr uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
constexpr uint64_t Round(uint64_t acc, uint64_t w) { return Rotl(acc + w * kP2, 31) * kP1; }

template <typename T>
void Put(std::string& out, size_t off, T v) {
  std::memcpy(out.data() + off, &v, sizeof(T));
}
template <typename T>
T Get(std::string_view in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof(T));
  return v;
}

// The checksum covers the header with its checksum field zeroed, then the rest.
uint64_t ValueChecksum(std::string_view v) {
  uint8_t head[kFixedBytes];
  std::memcpy(head, v.data(), kFixedBytes);
  std::memset(head + kOffChecksum, 0, 8);
  const uint64_t h = TierChecksum(head, kFixedBytes);
  return TierChecksum(reinterpret_cast<const uint8_t*>(v.data()) + kFixedBytes,
                      v.size() - kFixedBytes, h);
}

}  // namespace

std::string_view TierRejectName(TierReject r) {
  switch (r) {
    case TierReject::kNone:
      return "none";
    case TierReject::kTruncated:
      return "truncated";
    case TierReject::kCorrupt:
      return "corrupt";
    case TierReject::kForeign:
      return "foreign";
    case TierReject::kMismatch:
      return "mismatch";
  }
  return "unknown";
}

int64_t TierHeaderBytes(int32_t block_size) {
  return static_cast<int64_t>(kFixedBytes) + int64_t{4} * block_size;
}

uint64_t TierChecksum(const uint8_t* data, size_t n, uint64_t seed) {
  uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, data + i, 32);
    a = Round(a, w[0]);
    b = Round(b, w[1]);
    c = Round(c, w[2]);
    d = Round(d, w[3]);
  }
  uint64_t h = Rotl(a, 1) + Rotl(b, 7) + Rotl(c, 12) + Rotl(d, 18) + n;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    h = Rotl(h ^ Round(0, w), 27) * kP1 + kP3;
  }
  for (; i < n; ++i) h = Rotl(h ^ (data[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string TierStoreKey(std::string_view prefix, const TierIdentity& id, BlockHash hash) {
  return absl::StrCat(std::string(prefix), "v", kTierLayoutVersion, ":",
                      absl::StrFormat("%016x:%016x:%d:%016x", id.model_fingerprint, id.kv_format,
                                      id.block_size, hash));
}

std::string EncodeBlockValue(const TierIdentity& id, const TierBlockKey& key,
                             std::span<const uint8_t> payload) {
  if (static_cast<int64_t>(payload.size()) != id.payload_bytes) {
    std::fprintf(stderr, "EncodeBlockValue: %zu payload bytes for %lld\n", payload.size(),
                 static_cast<long long>(id.payload_bytes));
    std::abort();
  }
  std::string out(static_cast<size_t>(TierValueBytes(id)), '\0');
  auto* v = reinterpret_cast<uint8_t*>(out.data());
  EncodeBlockHeader(id, key, v);
  std::memcpy(v + TierHeaderBytes(id.block_size), payload.data(), payload.size());
  SealBlockValue(v, static_cast<int64_t>(out.size()));
  return out;
}

void EncodeBlockHeader(const TierIdentity& id, const TierBlockKey& key, uint8_t* value) {
  if (static_cast<int32_t>(key.tokens.size()) != id.block_size) {
    std::fprintf(stderr, "EncodeBlockHeader: %zu tokens for blocks of %d\n", key.tokens.size(),
                 id.block_size);
    std::abort();
  }
  std::string head(kFixedBytes, '\0');
  std::memcpy(head.data(), kMagic, 4);
  Put<uint32_t>(head, kOffVersion, kTierLayoutVersion);
  Put<uint64_t>(head, kOffModel, id.model_fingerprint);
  Put<uint64_t>(head, kOffFormat, id.kv_format);
  Put<uint32_t>(head, kOffBlockSize, static_cast<uint32_t>(id.block_size));
  Put<uint64_t>(head, kOffPayloadBytes, static_cast<uint64_t>(id.payload_bytes));
  Put<uint64_t>(head, kOffHash, key.hash);
  Put<uint64_t>(head, kOffParent, key.parent);
  Put<uint64_t>(head, kOffExtra, key.extra_key);
  std::memcpy(value, head.data(), kFixedBytes);
  std::memcpy(value + kFixedBytes, key.tokens.data(), key.tokens.size() * 4);
}

void SealBlockValue(uint8_t* value, int64_t size) {
  const uint64_t sum = ValueChecksum(
      std::string_view(reinterpret_cast<const char*>(value), static_cast<size_t>(size)));
  std::memcpy(value + kOffChecksum, &sum, sizeof(sum));
}

DecodedBlock DecodeBlockValue(std::string_view v, const TierIdentity& id, const TierBlockKey& key) {
  DecodedBlock d;
  if (v.size() < kFixedBytes) {
    d.reject = TierReject::kTruncated;
    return d;
  }
  if (std::memcmp(v.data(), kMagic, 4) != 0) {
    d.reject = TierReject::kCorrupt;
    return d;
  }
  const int64_t block_size = Get<uint32_t>(v, kOffBlockSize);
  const uint64_t payload = Get<uint64_t>(v, kOffPayloadBytes);
  // The sizes the header claims; a value shorter than that was cut off.
  const uint64_t want =
      static_cast<uint64_t>(
          TierHeaderBytes(static_cast<int32_t>(std::min<int64_t>(block_size, int64_t{1} << 24)))) +
      std::min<uint64_t>(payload, uint64_t{1} << 40);
  if (v.size() < want) {
    d.reject = TierReject::kTruncated;
    return d;
  }
  if (v.size() != want || Get<uint64_t>(v, kOffChecksum) != ValueChecksum(v)) {
    d.reject = TierReject::kCorrupt;
    return d;
  }
  if (Get<uint32_t>(v, kOffVersion) != kTierLayoutVersion ||
      Get<uint64_t>(v, kOffModel) != id.model_fingerprint ||
      Get<uint64_t>(v, kOffFormat) != id.kv_format || block_size != id.block_size ||
      static_cast<int64_t>(payload) != id.payload_bytes) {
    d.reject = TierReject::kForeign;
    return d;
  }
  if (Get<uint64_t>(v, kOffHash) != key.hash || Get<uint64_t>(v, kOffParent) != key.parent ||
      Get<uint64_t>(v, kOffExtra) != key.extra_key ||
      static_cast<int64_t>(key.tokens.size()) != block_size ||
      std::memcmp(v.data() + kFixedBytes, key.tokens.data(), key.tokens.size() * 4) != 0) {
    d.reject = TierReject::kMismatch;
    return d;
  }
  d.payload_offset = TierHeaderBytes(id.block_size);
  return d;
}

}  // namespace kvserve
