// Memory the [gpu] tests own: DeviceBuffer (cudaMalloc) and PinnedBuffer
// (cudaHostAlloc, mapped), with typed upload/download, plus REQUIRE_CUDA and
// RequireOk for one-line checks, and the activation-type conversions
// (FromF, ToF, SameBits) every kernel test needs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"

#define REQUIRE_CUDA(...) REQUIRE((__VA_ARGS__) == cudaSuccess)

namespace kvserve::testing {

inline void RequireOk(const absl::Status& status) {
  INFO(std::string(status.message()));
  REQUIRE(status.ok());
}

// Expects InvalidArgument with `field` in the message.
inline void RequireBadField(const absl::Status& status, const std::string& field) {
  INFO(std::string(status.message()));
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(status.message()).find(field) != std::string::npos);
}

// fp32 <-> an activation storage type, rounding to nearest.
template <typename T>
T FromF(float v);
template <>
inline float FromF<float>(float v) {
  return v;
}
template <>
inline __half FromF<__half>(float v) {
  return __float2half_rn(v);
}
template <>
inline __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
inline float ToF(float v) { return v; }
inline float ToF(__half v) { return __half2float(v); }
inline float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
bool SameBits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    REQUIRE_CUDA(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  size_t bytes() const { return bytes_; }
  template <typename T = uint8_t>
  T* as(int64_t offset = 0) const {
    return static_cast<T*>(ptr_) + offset;
  }
  template <typename T>
  void Upload(const std::vector<T>& host, int64_t offset = 0) {
    REQUIRE((offset + host.size()) * sizeof(T) <= bytes_);
    REQUIRE_CUDA(
        cudaMemcpy(as<T>(offset), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename T>
  std::vector<T> Download(size_t count, int64_t offset = 0) const {
    REQUIRE((offset + count) * sizeof(T) <= bytes_);
    std::vector<T> host(count);
    REQUIRE_CUDA(cudaMemcpy(host.data(), as<T>(offset), count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned, mapped host memory (what a swap pool is).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    REQUIRE_CUDA(cudaHostAlloc(&ptr_, bytes == 0 ? 1 : bytes, cudaHostAllocMapped));
  }
  ~PinnedBuffer() { cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  size_t bytes() const { return bytes_; }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvserve::testing
