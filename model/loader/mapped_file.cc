#include "model/loader/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {

uint64_t FingerprintBytes(const uint8_t* data, size_t n) {
  // Four independent multiply-rotate lanes (xxHash64's round), merged at the
  // end: the loop is bound by memory bandwidth, not by one dependency chain.
  constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
  constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
  constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
  auto round = [](uint64_t acc, uint64_t v) {
    acc += v * kP2;
    acc = (acc << 31) | (acc >> 33);
    return acc * kP1;
  };
  uint64_t lane[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t v;
      std::memcpy(&v, data + i + 8 * l, 8);
      lane[l] = round(lane[l], v);
    }
  }
  uint64_t h = n * kP3;
  for (uint64_t l : lane) h = round(h ^ round(0, l), l) * kP1 + kP3;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, data + i, 8);
    h = round(h, v) ^ (h >> 29);
  }
  for (; i < n; ++i) h = (h ^ data[i]) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string FingerprintHex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint));
  return buf;
}

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                             FileAccess access) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0 && access == FileAccess::kRead) {
    f->owned_.resize(f->size_);
    size_t done = 0;
    while (done < f->size_) {
      const ssize_t n = ::read(fd, f->owned_.data() + done, f->size_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        return absl::InternalError(
            absl::StrCat(path, ": read failed after ", done, " of ", f->size_,
                         " bytes: ", n == 0 ? "the file shrank" : std::strerror(err)));
      }
      done += static_cast<size_t>(n);
    }
    f->data_ = reinterpret_cast<const uint8_t*>(f->owned_.data());
  } else if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  }
  ::close(fd);
  return f;
}

std::shared_ptr<MappedFile> MappedFile::FromBytes(std::string path, std::string bytes) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = std::move(path);
  f->owned_ = std::move(bytes);
  f->size_ = f->owned_.size();
  f->data_ = f->size_ > 0 ? reinterpret_cast<const uint8_t*>(f->owned_.data()) : nullptr;
  return f;
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kvserve
