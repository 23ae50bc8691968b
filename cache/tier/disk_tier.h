// DiskTier: encoded block values (block_value.h) in one preallocated file,
// so a restarted replica starts warm.
//
// File layout (little-endian):
//   header (4096 bytes): magic "KVTD", layout version, the TierIdentity,
//     slot bytes, slot count, checksum of the header;
//   index: one 24-byte record per slot {block hash, LRU stamp, state},
//     written after the slot's bytes, so a record never names bytes that
//     were not written (a torn write is caught by the value's checksum);
//   slots: [slot count][slot bytes], each one value padded to 4096.
// Open() keeps a file whose header matches the identity and sizes (its
// index is read back: the warm start) and starts any other afresh (another
// model's or format's file is overwritten, never read). A write that fails
// (a full disk) turns the tier off: Put and Get then do nothing and
// disabled_reason() says why, for the engine's one log line. A slot whose
// value is refused on load is dropped and the cause returned.
//
// Background reads (disk_loader.h): Locate names a block's slot and the
// slot's generation (bumped by every write or drop of the slot) on the
// engine thread; ReadSlot reads and checks it on any thread; Settle, back on
// the engine thread, keeps the read only if the slot still holds the same
// generation (else a write raced it: a miss, nothing dropped) and drops a
// refused slot.
//
// Thread-safety: engine thread only, except ReadSlot (any thread: pread
// and the tier's fixed sizes). I/O is pread/pwrite.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache/tier/block_value.h"

namespace kvserve {

class DiskTier {
 public:
  // Opens or creates `path` with room for capacity_bytes of slots
  // (preallocated). InvalidArgument when not even one slot fits; the errno
  // text when the file cannot be created or preallocated.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const std::string& path,
                                                        int64_t capacity_bytes,
                                                        const TierIdentity& id);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  int32_t num_slots() const { return static_cast<int32_t>(stamp_.size()); }
  int32_t size() const { return static_cast<int32_t>(slot_of_.size()); }
  int64_t bytes_used() const { return int64_t{size()} * slot_bytes_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  // Slots read back from the file at Open.
  int32_t num_restored() const { return restored_; }
  bool enabled() const { return disabled_reason_.empty(); }
  const std::string& disabled_reason() const { return disabled_reason_; }
  bool Contains(BlockHash hash) const { return slot_of_.contains(hash); }

  // Writes a value into a free or the least recently used slot. False when
  // the tier is off (or turned off by this write's failure).
  bool Put(BlockHash hash, const std::string& value);
  // Reads and checks the block `key` names; null on a miss; *reject says
  // why a stored value was dropped.
  std::shared_ptr<const std::string> Get(const TierBlockKey& key, TierReject* reject);

  // The slot holding `hash` and its generation; false on a miss.
  bool Locate(BlockHash hash, int32_t* slot, uint64_t* generation) const;
  // Reads and checks a slot against `key` (any thread); null with *reject
  // set when the bytes are refused or cannot be read.
  std::shared_ptr<const std::string> ReadSlot(int32_t slot, const TierBlockKey& key,
                                              TierReject* reject) const;
  // A background read's outcome, on the engine thread: true when the slot
  // still holds the generation read (the value may be used; refreshed as
  // most recently used, or dropped when refused).
  bool Settle(BlockHash hash, int32_t slot, uint64_t generation, TierReject reject);

 private:
  DiskTier(int fd, std::string path, const TierIdentity& id, int64_t slot_bytes, int32_t slots);
  bool WriteRecord(int32_t slot);
  void Disable(const std::string& why);
  void Drop(int32_t slot);

  int fd_;
  std::string path_;
  TierIdentity id_;
  int64_t slot_bytes_;
  int64_t data_offset_;
  std::vector<uint64_t> stamp_;  // [slots] LRU stamp; 0: free
  std::vector<BlockHash> hash_;  // [slots]
  std::vector<uint64_t> gen_;    // [slots] bumped by every write or drop
  absl::flat_hash_map<BlockHash, int32_t> slot_of_;
  uint64_t clock_ = 0;
  int32_t restored_ = 0;
  std::string disabled_reason_;
};

}  // namespace kvserve
