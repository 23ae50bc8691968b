// MappedFile: a read-only mmap of a whole file (checkpoints, safetensors), or
// bytes held in memory under a name (FromBytes: parsers fed by a fuzzer or a
// test without a file).
//
// Thread-safety: immutable after Open / FromBytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvserve {

class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
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
