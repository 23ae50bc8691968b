// RMSNorm on the GPU against the CPU kernel (cpu::RmsNorm) on the same
// values, for fp32 / fp16 / bf16, plain and fused with the residual add,
// over odd sizes and both access paths. The fused sum must be bitwise the
// CPU's (one rounding of x + residual); the normalised output may differ
// from the CPU's fp32 result by the fp32 summation order of the squares
// (block tree vs sequential), rsqrtf vs 1 / sqrtf (2 ulp) and the product
// order, a few 1e-7 relative, plus half an ulp of the storage dtype: the
// tolerances below.
#include "kernels/cuda/layers/rms_norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/layers/ops.h"
#include "tests/kernels/cuda/device_buffer.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::FromF;
using ::kvserve::testing::ToF;

template <typename T>
struct Traits;
template <>
struct Traits<float> {
  static constexpr ActDtype kDtype = ActDtype::kFp32;
  static constexpr double kRel = 1e-5, kAbs = 1e-6;
};
template <>
struct Traits<__half> {
  static constexpr ActDtype kDtype = ActDtype::kFp16;
  static constexpr double kRel = 1e-3, kAbs = 1e-4;  // half an ulp is 4.9e-4
};
template <>
struct Traits<__nv_bfloat16> {
  static constexpr ActDtype kDtype = ActDtype::kBf16;
  static constexpr double kRel = 8e-3, kAbs = 1e-3;  // half an ulp is 3.9e-3
};

// Device memory owned by the test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    REQUIRE(cudaMalloc(&ptr_, bytes) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as(int64_t offset = 0) const {
    return static_cast<T*>(ptr_) + offset;
  }
  template <typename T>
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() * sizeof(T) <= bytes_);
    REQUIRE(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) ==
            cudaSuccess);
  }
  template <typename T>
  std::vector<T> Download(size_t count) const {
    std::vector<T> host(count);
    REQUIRE(cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
std::vector<T> Random(size_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (T& e : v) e = FromF<T>(dist(gen));
  return v;
}

// One scenario: rows of `dim` at the given strides (elements), `offset`
// elements into each buffer (to break 16-byte alignment), optionally fused.
struct Case {
  int64_t tokens, dim;
  bool fused;
  int64_t stride = 0;  // 0: dim
  int64_t offset = 0;
  bool out_aliases_input = false;  // out = residual (fused) or x (plain)
};

template <typename T>
void RunCase(const Case& c) {
  const int64_t stride = c.stride == 0 ? c.dim : c.stride;
  const size_t elems = static_cast<size_t>(c.offset + c.tokens * stride);
  INFO("tokens " << c.tokens << " dim " << c.dim << " fused " << c.fused << " stride " << stride
                 << " offset " << c.offset << " aliased " << c.out_aliases_input);
  const std::vector<T> x = Random<T>(elems, -2.0f, 2.0f, 1 + c.dim + c.tokens);
  const std::vector<T> residual = Random<T>(elems, -1.0f, 1.0f, 2 + c.dim);
  const std::vector<T> weight = Random<T>(static_cast<size_t>(c.offset + c.dim), 0.5f, 1.5f, 3);
  const float eps = 1e-5f;

  DeviceBuffer dx(elems * sizeof(T)), dres(elems * sizeof(T)), dout(elems * sizeof(T));
  DeviceBuffer dw(weight.size() * sizeof(T));
  dx.Upload(x);
  dres.Upload(residual);
  dw.Upload(weight);
  REQUIRE(cudaMemset(dout.as<T>(), 0, elems * sizeof(T)) == cudaSuccess);

  RmsNormParams p;
  p.x = dx.as<T>(c.offset);
  p.residual = c.fused ? dres.as<T>(c.offset) : nullptr;
  p.weight = dw.as<T>(c.offset);
  const DeviceBuffer& out_buffer = !c.out_aliases_input ? dout : (c.fused ? dres : dx);
  p.out = out_buffer.as<T>(c.offset);
  p.num_tokens = c.tokens;
  p.dim = c.dim;
  p.x_stride = p.residual_stride = p.out_stride = stride;
  p.eps = eps;
  p.dtype = Traits<T>::kDtype;
  const absl::Status status = RmsNorm(p, nullptr);
  INFO(std::string(status.message()));
  REQUIRE(status.ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  const std::vector<T> x_after = dx.Download<T>(elems);
  const std::vector<T> out = out_buffer.Download<T>(elems);
  for (int64_t t = 0; t < c.tokens; ++t) {
    const int64_t row = c.offset + t * stride;
    // Reference: the fused sum rounded to T once, then cpu::RmsNorm in fp32.
    std::vector<float> s(c.dim), w(c.dim), ref(c.dim);
    for (int64_t i = 0; i < c.dim; ++i) {
      float v = ToF(x[row + i]);
      if (c.fused) v = ToF(FromF<T>(v + ToF(residual[row + i])));
      s[i] = v;
      w[i] = ToF(weight[c.offset + i]);
    }
    cpu::RmsNorm(s.data(), w.data(), ref.data(), 1, c.dim, eps);
    int bad = 0;
    for (int64_t i = 0; i < c.dim; ++i) {
      // x holds the rounded sum when fused, and is untouched when plain
      // (unless out is x). Conversions to float are exact, so this is bitwise.
      const float x_want = c.fused ? s[i] : ToF(x[row + i]);
      if ((c.fused || !c.out_aliases_input) && ToF(x_after[row + i]) != x_want) {
        if (bad++ < 5)
          UNSCOPED_INFO("row " << t << " col " << i << " x " << ToF(x_after[row + i]) << " want "
                               << x_want);
      }
      const double want = ref[i];
      const double got = ToF(out[row + i]);
      if (!(std::abs(got - want) <= Traits<T>::kRel * std::abs(want) + Traits<T>::kAbs)) {
        if (bad++ < 5)
          UNSCOPED_INFO("row " << t << " col " << i << " out " << got << " want " << want);
      }
    }
    REQUIRE(bad == 0);
  }
}

TEMPLATE_TEST_CASE("RmsNorm matches cpu::RmsNorm over odd sizes", "[gpu]", float, __half,
                   __nv_bfloat16) {
  for (bool fused : {false, true}) {
    for (int64_t dim : {64, 4096, 5000, 4097}) {
      for (int64_t tokens : {1, 3, 17}) RunCase<TestType>({tokens, dim, fused});
    }
  }
}

TEMPLATE_TEST_CASE("RmsNorm handles strided, unaligned and in-place rows", "[gpu]", float, __half,
                   __nv_bfloat16) {
  for (bool fused : {false, true}) {
    SECTION("rows padded to a stride that breaks vector alignment") {
      RunCase<TestType>({5, 4096, fused, /*stride=*/4099});
    }
    SECTION("buffers one element past 16-byte alignment") {
      RunCase<TestType>({3, 4096, fused, /*stride=*/0, /*offset=*/1});
    }
    SECTION("out aliasing the residual (fused) or x (plain)") {
      RunCase<TestType>({17, 5000, fused, 0, 0, /*out_aliases_input=*/true});
    }
  }
}

TEST_CASE("RmsNorm rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(4096);
  RmsNormParams p;
  p.x = p.out = buffer.as<float>();
  p.weight = buffer.as<float>();
  p.num_tokens = 1;
  p.dim = 64;
  SECTION("a valid call is fine, and zero tokens launch nothing") {
    REQUIRE(RmsNorm(p, nullptr).ok());
    p.num_tokens = 0;
    p.x = p.out = nullptr;
    REQUIRE(RmsNorm(p, nullptr).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  auto require_bad = [&](const std::string& field) {
    const absl::Status status = RmsNorm(p, nullptr);
    INFO(std::string(status.message()));
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(status.message()).find(field) != std::string::npos);
  };
  SECTION("dim") {
    p.dim = 0;
    require_bad("dim");
  }
  SECTION("stride") {
    p.x_stride = 32;
    require_bad("x_stride");
  }
  SECTION("eps") {
    p.eps = 0.0f;
    require_bad("eps");
  }
  SECTION("null weight") {
    p.weight = nullptr;
    require_bad("weight");
  }
  SECTION("fused with out aliasing x") {
    p.residual = buffer.as<float>(512);
    require_bad("alias");
  }
}

}  // namespace
}  // namespace kvserve::cuda
