// MappedFile: the bytes of a whole file (checkpoints, safetensors), read into
// memory of its own (kRead, the default) or a read-only mmap (kMmap), or
// bytes held in memory under a name (FromBytes: parsers fed by a fuzzer or a
// test without a file).
//
// kRead costs the file's size in RAM and its read time at load, and then
// nothing outside the process can change the bytes. kMmap shares the page
// cache and starts faster, but the file stays part of the process: one
// truncated while served makes the next read of a page past its end SIGBUS
// (the process dies), and one rewritten in place changes the weights served
// under the same name (model.mmap in the daemon's config).
//
// Thread-safety: immutable after Open / FromBytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvserve {

enum class FileAccess { kRead, kMmap };

// A 64-bit hash of n bytes, about memory speed: weights' fingerprints (a
// changed file shows as a changed value; not a defence against a forger).
uint64_t FingerprintBytes(const uint8_t* data, size_t n);
// FingerprintBytes as 16 lowercase hex digits.
std::string FingerprintHex(uint64_t fingerprint);

class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path,
                                                          FileAccess access = FileAccess::kRead);
  // `bytes` owned by the object; `path` is only what errors call it.
  static std::shared_ptr<MappedFile> FromBytes(std::string path, std::string bytes);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // data_ is an mmap (else it points into owned_)
  std::string owned_;
};

}  // namespace kvserve
