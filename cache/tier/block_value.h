// The value a tier below the device pool stores for one prefix block, and
// the identity that makes a block's bytes mean something.
//
// A value is a fixed header, the block's token ids and its bytes exactly as
// the device pool stores them (every layer, scales inside, layer after
// layer; ModelRunner::ExportBlocks):
//
//   magic "KVTB" | layout version u32 | model fingerprint u64 |
//   kv format u64 | block size u32 | payload bytes u64 |
//   block hash u64 | parent hash u64 | extra key u64 (cache salt) |
//   checksum u64 (of everything else) | tokens i32[block size] | payload
//
// Little-endian (every supported host). DecodeBlockValue checks all of it
// before a byte reaches the device pool and names why it refuses a value:
// truncated (shorter than its header says), corrupt (magic or checksum),
// foreign (another model, KV format, block size or layout version), or
// mismatch (another block: hash, parent, salt or tokens differ, as prefix
// hits are re-checked on the device). Tiers drop a refused value.
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/block_hash.h"
#include "cache/kv_tier_hooks.h"  // TierBlockKey

namespace kvserve {

inline constexpr uint32_t kTierLayoutVersion = 1;

// Everything besides the block's own hash that its bytes depend on.
struct TierIdentity {
  uint64_t model_fingerprint = 0;  // weights' identity, dtype, shape, RoPE
  uint64_t kv_format = 0;          // every layer's dtype and page layout
  int32_t block_size = 0;          // tokens per block
  int64_t payload_bytes = 0;       // one block, every layer, as stored
  friend bool operator==(const TierIdentity&, const TierIdentity&) = default;
};

enum class TierReject : uint8_t { kNone, kTruncated, kCorrupt, kForeign, kMismatch };
inline constexpr int kNumTierRejects = 5;
std::string_view TierRejectName(TierReject r);  // "truncated", "corrupt", ...

// Bytes before the payload for a block size.
int64_t TierHeaderBytes(int32_t block_size);
// Header + tokens + payload.
inline int64_t TierValueBytes(const TierIdentity& id) {
  return TierHeaderBytes(id.block_size) + id.payload_bytes;
}

// A 64-bit checksum of bytes (word-at-a-time multiply-rotate; not
// cryptographic: it catches corruption, not forgery).
uint64_t TierChecksum(const uint8_t* data, size_t n, uint64_t seed = 0);

// The store key of a block in a shared store: prefix, identity and hash, so
// replicas with another model or format never read each other's blocks.
std::string TierStoreKey(std::string_view prefix, const TierIdentity& id, BlockHash hash);

// Encodes one block; payload.size() must be id.payload_bytes and
// key.tokens.size() id.block_size (aborts otherwise: caller's bug).
std::string EncodeBlockValue(const TierIdentity& id, const TierBlockKey& key,
                             std::span<const uint8_t> payload);

// The same value written in place, for a payload that arrives separately
// (the runner copies it to value + TierHeaderBytes, perhaps asynchronously):
// EncodeBlockHeader writes the header and tokens, SealBlockValue the
// checksum once the payload is there. value: TierValueBytes(id) bytes.
void EncodeBlockHeader(const TierIdentity& id, const TierBlockKey& key, uint8_t* value);
void SealBlockValue(uint8_t* value, int64_t size);

struct DecodedBlock {
  TierReject reject = TierReject::kNone;
  int64_t payload_offset = 0;  // into the value, when accepted
  bool ok() const { return reject == TierReject::kNone; }
};
// Checks a value against the identity and the block it should hold.
DecodedBlock DecodeBlockValue(std::string_view value, const TierIdentity& id,
                              const TierBlockKey& key);

}  // namespace kvserve
