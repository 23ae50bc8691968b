// SwiGLU on the GPU against cpu::SiluMul over a fused [gate][up] buffer:
// bit for bit where the CPU runs its AVX2 path (whose e^x polynomial the
// kernel transcribes), within 4 ulp where it runs the scalar expf; fp16/bf16
// equal the CPU's fp32 result rounded once. Also in place and with strides.
#include "kernels/cuda/layers/swiglu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/layers/ops.h"
#include "tests/kernels/cuda/device_buffer.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::DeviceBuffer;
using ::kvserve::testing::FromF;
using ::kvserve::testing::RequireBadField;
using ::kvserve::testing::RequireOk;
using ::kvserve::testing::SameBits;
using ::kvserve::testing::ToF;

template <typename T>
void RunCase(ActDtype dtype, int64_t tokens, int64_t hidden, bool in_place, int64_t pad,
             uint64_t seed) {
  INFO("dtype " << static_cast<int>(dtype) << " tokens " << tokens << " hidden " << hidden
                << " in place " << in_place << " pad " << pad);
  const int64_t gu_stride = 2 * hidden + pad;
  const int64_t out_stride = in_place ? gu_stride : hidden + pad;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  std::vector<T> gate_up(tokens * gu_stride);
  for (size_t i = 0; i < gate_up.size(); ++i) {
    float v = dist(rng);
    if (i % 97 == 5) v *= 10.0f;  // past the polynomial's clamps
    gate_up[i] = FromF<T>(v);
  }
  std::vector<T> want(tokens * out_stride, FromF<T>(-7.0f));
  if (in_place) want = gate_up;
  std::vector<float> gate(hidden), up(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < hidden; ++i) {
      gate[i] = ToF(gate_up[t * gu_stride + i]);
      up[i] = ToF(gate_up[t * gu_stride + hidden + i]);
    }
    cpu::SiluMul(gate.data(), up.data(), hidden);
    for (int64_t i = 0; i < hidden; ++i) want[t * out_stride + i] = FromF<T>(gate[i]);
  }

  DeviceBuffer d_gu(gate_up.size() * sizeof(T)), d_out(want.size() * sizeof(T));
  d_gu.Upload(gate_up);
  if (!in_place) d_out.Upload(std::vector<T>(want.size(), FromF<T>(-7.0f)));
  SwiGluParams p;
  p.gate_up = d_gu.as<T>();
  p.out = in_place ? d_gu.as<T>() : d_out.as<T>();
  p.num_tokens = tokens;
  p.hidden = hidden;
  p.gate_up_stride = gu_stride;
  p.out_stride = out_stride;
  p.dtype = dtype;
  RequireOk(SwiGlu(p, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::vector<T> got = (in_place ? d_gu : d_out).Download<T>(want.size());
  const bool exact = cpu::DefaultCpuIsa() == cpu::CpuIsa::kAvx2;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = ToF(got[i]), w = ToF(want[i]);
    const bool ok = exact ? std::memcmp(&got[i], &want[i], sizeof(T)) == 0
                          : std::fabs(g - w) <= 4 * std::fabs(w) * 1.2e-7f + 1e-30f;
    if (!ok && bad++ < 5) UNSCOPED_INFO("element " << i << ": " << g << " want " << w);
  }
  REQUIRE(bad == 0);
}

TEST_CASE("SwiGlu equals cpu::SiluMul on the gate half and the up half", "[gpu]") {
  if (cpu::DefaultCpuIsa() != cpu::CpuIsa::kAvx2) {
    WARN("this CPU runs the scalar SiluMul (libm expf): comparing within 4 ulp, not bitwise");
  }
  uint64_t seed = 1;
  for (int64_t hidden : {1, 7, 64, 4099}) {
    for (int64_t tokens : {1, 9}) {
      RunCase<float>(ActDtype::kFp32, tokens, hidden, false, 0, seed++);
      RunCase<__half>(ActDtype::kFp16, tokens, hidden, false, 0, seed++);
      RunCase<__nv_bfloat16>(ActDtype::kBf16, tokens, hidden, false, 0, seed++);
    }
  }
  RunCase<float>(ActDtype::kFp32, 5, 300, /*in_place=*/true, 0, seed++);
  RunCase<__nv_bfloat16>(ActDtype::kBf16, 5, 300, true, 3, seed++);
  RunCase<__half>(ActDtype::kFp16, 5, 300, false, /*pad=*/5, seed++);
}

TEST_CASE("SwiGlu rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(4096);
  SwiGluParams p;
  p.gate_up = p.out = buffer.as<float>();
  p.num_tokens = 1;
  p.hidden = 8;
  SECTION("hidden") {
    p.hidden = 0;
    RequireBadField(SwiGlu(p, nullptr), "hidden");
  }
  SECTION("gate_up_stride") {
    p.gate_up_stride = 15;
    RequireBadField(SwiGlu(p, nullptr), "gate_up_stride");
  }
  SECTION("out") {
    p.out = nullptr;
    RequireBadField(SwiGlu(p, nullptr), "out");
  }
}

}  // namespace
}  // namespace kvserve::cuda
