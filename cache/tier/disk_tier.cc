#include "cache/tier/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'T', 'D'};
constexpr int64_t kPage = 4096;
constexpr int64_t kRecordBytes = 24;

struct FileHeader {
  char magic[4];
  uint32_t version;
  uint64_t model_fingerprint;
  uint64_t kv_format;
  int64_t block_size;
  int64_t payload_bytes;
  int64_t slot_bytes;
  int64_t num_slots;
  uint64_t checksum;  // of the fields above
};

struct Record {
  uint64_t hash;
  uint64_t stamp;  // 0: free
  uint64_t check;  // hash ^ stamp ^ constant: a torn record reads as free
};
constexpr uint64_t kRecordSalt = 0x5bd1e9955bd1e995ull;

uint64_t HeaderChecksum(const FileHeader& h) {
  return TierChecksum(reinterpret_cast<const uint8_t*>(&h), offsetof(FileHeader, checksum));
}

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

bool PWriteAll(int fd, const void* data, size_t n, int64_t off) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    off += w;
  }
  return true;
}

bool PReadAll(int fd, void* data, size_t n, int64_t off) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += r;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& path,
                                                         int64_t capacity_bytes,
                                                         const TierIdentity& id) {
  const int64_t slot_bytes = RoundUp(TierValueBytes(id), kPage);
  const int64_t slots = capacity_bytes / (slot_bytes + kRecordBytes);
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cache.disk_tier_bytes (", capacity_bytes,
                                                   ") holds no block of ", slot_bytes, " bytes"));
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cache.disk_tier_path: cannot open ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<DiskTier> tier(
      new DiskTier(fd, path, id, slot_bytes, static_cast<int32_t>(slots)));
  FileHeader want{};
  std::memcpy(want.magic, kMagic, 4);
  want.version = kTierLayoutVersion;
  want.model_fingerprint = id.model_fingerprint;
  want.kv_format = id.kv_format;
  want.block_size = id.block_size;
  want.payload_bytes = id.payload_bytes;
  want.slot_bytes = slot_bytes;
  want.num_slots = slots;
  want.checksum = HeaderChecksum(want);
  FileHeader have{};
  const bool same =
      PReadAll(fd, &have, sizeof(have), 0) && std::memcmp(&have, &want, sizeof(want)) == 0;
  const int64_t index_bytes = slots * kRecordBytes;
  if (same) {
    std::vector<Record> records(static_cast<size_t>(slots));
    if (!PReadAll(fd, records.data(), static_cast<size_t>(index_bytes), kPage)) {
      return absl::DataLossError(
          absl::StrCat("cache.disk_tier_path: cannot read the index of ", path));
    }
    for (int32_t s = 0; s < slots; ++s) {
      const Record& r = records[s];
      if (r.stamp == 0 || r.check != (r.hash ^ r.stamp ^ kRecordSalt)) continue;
      if (tier->slot_of_.contains(r.hash)) continue;
      tier->stamp_[s] = r.stamp;
      tier->hash_[s] = r.hash;
      tier->slot_of_[r.hash] = s;
      tier->clock_ = std::max(tier->clock_, r.stamp);
      ++tier->restored_;
    }
    return tier;
  }
  // A new file, or another identity's: start afresh, preallocated.
  const int64_t total = tier->data_offset_ + slots * slot_bytes;
  if (ftruncate(fd, 0) != 0 || posix_fallocate(fd, 0, total) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cache.disk_tier_path: cannot preallocate ",
                                                     total, " bytes in ", path, ": ",
                                                     std::strerror(errno)));
  }
  std::vector<uint8_t> zeros(static_cast<size_t>(index_bytes), 0);
  if (!PWriteAll(fd, zeros.data(), zeros.size(), kPage) || !PWriteAll(fd, &want, sizeof(want), 0) ||
      fdatasync(fd) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cache.disk_tier_path: cannot write ", path, ": ", std::strerror(errno)));
  }
  return tier;
}

DiskTier::DiskTier(int fd, std::string path, const TierIdentity& id, int64_t slot_bytes,
                   int32_t slots)
    : fd_(fd),
      path_(std::move(path)),
      id_(id),
      slot_bytes_(slot_bytes),
      data_offset_(kPage + RoundUp(int64_t{slots} * kRecordBytes, kPage)),
      stamp_(slots, 0),
      hash_(slots, 0),
      gen_(slots, 0) {}

DiskTier::~DiskTier() { ::close(fd_); }

void DiskTier::Disable(const std::string& why) {
  if (disabled_reason_.empty()) disabled_reason_ = why;
  slot_of_.clear();
}

bool DiskTier::WriteRecord(int32_t slot) {
  const Record r{hash_[slot], stamp_[slot],
                 stamp_[slot] == 0 ? 0 : hash_[slot] ^ stamp_[slot] ^ kRecordSalt};
  return PWriteAll(fd_, &r, sizeof(r), kPage + int64_t{slot} * kRecordBytes);
}

void DiskTier::Drop(int32_t slot) {
  ++gen_[slot];
  slot_of_.erase(hash_[slot]);
  stamp_[slot] = 0;
  if (!WriteRecord(slot))
    Disable(absl::StrCat("cannot write the index of ", path_, ": ", std::strerror(errno)));
}

bool DiskTier::Put(BlockHash hash, const std::string& value) {
  if (!enabled() || static_cast<int64_t>(value.size()) > slot_bytes_) return false;
  int32_t slot = -1;
  if (auto it = slot_of_.find(hash); it != slot_of_.end()) {
    slot = it->second;
  } else {
    // A free slot, else the least recently used one.
    uint64_t oldest = UINT64_MAX;
    for (int32_t s = 0; s < num_slots(); ++s) {
      if (stamp_[s] < oldest) {
        oldest = stamp_[s];
        slot = s;
        if (oldest == 0) break;
      }
    }
    if (stamp_[slot] != 0) slot_of_.erase(hash_[slot]);
  }
  // Unlisted while its bytes change, listed again once they are written.
  ++gen_[slot];
  stamp_[slot] = 0;
  if (!WriteRecord(slot) ||
      !PWriteAll(fd_, value.data(), value.size(), data_offset_ + int64_t{slot} * slot_bytes_)) {
    Disable(absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
    return false;
  }
  hash_[slot] = hash;
  stamp_[slot] = ++clock_;
  if (!WriteRecord(slot)) {
    Disable(absl::StrCat("cannot write the index of ", path_, ": ", std::strerror(errno)));
    return false;
  }
  slot_of_[hash] = slot;
  return true;
}

std::shared_ptr<const std::string> DiskTier::Get(const TierBlockKey& key, TierReject* reject) {
  *reject = TierReject::kNone;
  int32_t slot;
  uint64_t gen;
  if (!Locate(key.hash, &slot, &gen)) return nullptr;
  std::shared_ptr<const std::string> value = ReadSlot(slot, key, reject);
  Settle(key.hash, slot, gen, *reject);
  return value;
}

bool DiskTier::Locate(BlockHash hash, int32_t* slot, uint64_t* generation) const {
  auto it = slot_of_.find(hash);
  if (it == slot_of_.end()) return false;
  *slot = it->second;
  *generation = gen_[it->second];
  return true;
}

std::shared_ptr<const std::string> DiskTier::ReadSlot(int32_t slot, const TierBlockKey& key,
                                                      TierReject* reject) const {
  *reject = TierReject::kNone;
  auto value = std::make_shared<std::string>(static_cast<size_t>(TierValueBytes(id_)), '\0');
  if (!PReadAll(fd_, value->data(), value->size(), data_offset_ + int64_t{slot} * slot_bytes_)) {
    *reject = TierReject::kTruncated;
    return nullptr;
  }
  const DecodedBlock d = DecodeBlockValue(*value, id_, key);
  if (!d.ok()) {
    *reject = d.reject;
    return nullptr;
  }
  return value;
}

bool DiskTier::Settle(BlockHash hash, int32_t slot, uint64_t generation, TierReject reject) {
  if (slot < 0 || slot >= num_slots() || gen_[slot] != generation || hash_[slot] != hash ||
      stamp_[slot] == 0) {
    return false;  // written or dropped since it was read
  }
  if (reject != TierReject::kNone) {
    Drop(slot);
    return false;
  }
  stamp_[slot] = ++clock_;  // the record's stamp is refreshed at the next write
  return true;
}

}  // namespace kvserve
