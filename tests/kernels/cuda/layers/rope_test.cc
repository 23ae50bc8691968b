// RoPE on the GPU against cpu::ApplyRope with the same cpu::RopeTable, both
// styles: bit for bit for fp32 activations, and for fp16/bf16 equal to the
// CPU's fp32 result rounded once (bound: zero differing bits). q and k sit in
// a fused QKV row whose V part must come through untouched.
#include "kernels/cuda/layers/rope.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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
void RunCase(ActDtype dtype, RopeStyle style, int head_dim, float theta, uint64_t seed) {
  INFO("dtype " << static_cast<int>(dtype) << " style " << static_cast<int>(style) << " head_dim "
                << head_dim << " theta " << theta);
  const int max_positions = 300, nq = 8, nkv = 2, tokens = 13;
  const cpu::RopeTable table(max_positions, head_dim, theta);
  const int half = head_dim / 2;
  const int64_t stride = static_cast<int64_t>(nq + 2 * nkv) * head_dim;  // [q][k][v]
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int32_t> position(0, max_positions - 1);
  std::vector<T> qkv(tokens * stride);
  for (T& v : qkv) v = FromF<T>(normal(rng));
  std::vector<int32_t> positions(tokens);
  for (int32_t& p : positions) p = position(rng);
  positions[0] = 0;
  positions[1] = max_positions - 1;

  // CPU: widen, rotate, round once.
  std::vector<T> want = qkv;
  std::vector<float> row(stride);
  for (int t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < stride; ++i) row[i] = ToF(qkv[t * stride + i]);
    const bool interleaved = style == RopeStyle::kInterleaved;
    cpu::ApplyRope(row.data(), nq, head_dim, table.cos(positions[t]), table.sin(positions[t]),
                   interleaved);
    cpu::ApplyRope(row.data() + nq * head_dim, nkv, head_dim, table.cos(positions[t]),
                   table.sin(positions[t]), interleaved);
    for (int64_t i = 0; i < (nq + nkv) * head_dim; ++i) want[t * stride + i] = FromF<T>(row[i]);
  }

  DeviceBuffer d_qkv(qkv.size() * sizeof(T)), d_pos(tokens * 4);
  DeviceBuffer d_cos(max_positions * half * 4), d_sin(max_positions * half * 4);
  d_qkv.Upload(qkv);
  d_pos.Upload(positions);
  REQUIRE_CUDA(cudaMemcpy(d_cos.as<float>(), table.cos(0), max_positions * half * 4,
                          cudaMemcpyHostToDevice));
  REQUIRE_CUDA(cudaMemcpy(d_sin.as<float>(), table.sin(0), max_positions * half * 4,
                          cudaMemcpyHostToDevice));
  RopeParams p;
  p.q = d_qkv.as<T>();
  p.k = d_qkv.as<T>(nq * head_dim);
  p.q_stride = p.k_stride = stride;
  p.positions = d_pos.as<int32_t>();
  p.cos = d_cos.as<float>();
  p.sin = d_sin.as<float>();
  p.max_positions = max_positions;
  p.num_tokens = tokens;
  p.num_q_heads = nq;
  p.num_kv_heads = nkv;
  p.head_dim = head_dim;
  p.style = style;
  p.dtype = dtype;
  RequireOk(ApplyRope(p, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::vector<T> got = d_qkv.Download<T>(qkv.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!SameBits(got[i], want[i]) && bad++ < 5) {
      UNSCOPED_INFO("element " << i << " (token " << i / stride << ", column " << i % stride
                               << "): " << ToF(got[i]) << " want " << ToF(want[i]));
    }
  }
  REQUIRE(bad == 0);
}

TEST_CASE("ApplyRope equals cpu::ApplyRope bit for bit, both styles", "[gpu]") {
  uint64_t seed = 1;
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    for (int head_dim : {8, 64, 128}) {
      for (float theta : {10000.0f, 500000.0f}) {
        RunCase<float>(ActDtype::kFp32, style, head_dim, theta, seed++);
        RunCase<__half>(ActDtype::kFp16, style, head_dim, theta, seed++);
        RunCase<__nv_bfloat16>(ActDtype::kBf16, style, head_dim, theta, seed++);
      }
    }
  }
}

TEST_CASE("ApplyRope turns a token with an out-of-range position into NaN", "[gpu]") {
  const int head_dim = 8, max_positions = 4;
  const cpu::RopeTable table(max_positions, head_dim, 10000.0f);
  DeviceBuffer d_q(2 * head_dim * 4), d_pos(8), d_cos(64), d_sin(64);
  d_q.Upload(std::vector<float>(2 * head_dim, 1.0f));
  d_pos.Upload(std::vector<int32_t>{1, max_positions});
  REQUIRE_CUDA(cudaMemcpy(d_cos.as<float>(), table.cos(0), 64, cudaMemcpyHostToDevice));
  REQUIRE_CUDA(cudaMemcpy(d_sin.as<float>(), table.sin(0), 64, cudaMemcpyHostToDevice));
  RopeParams p;
  p.q = d_q.as<float>();
  p.positions = d_pos.as<int32_t>();
  p.cos = d_cos.as<float>();
  p.sin = d_sin.as<float>();
  p.max_positions = max_positions;
  p.num_tokens = 2;
  p.num_q_heads = 1;
  p.head_dim = head_dim;
  RequireOk(ApplyRope(p, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::vector<float> got = d_q.Download<float>(2 * head_dim);
  for (int i = 0; i < head_dim; ++i) {
    REQUIRE(std::isfinite(got[i]));
    REQUIRE(std::isnan(got[head_dim + i]));
  }
}

TEST_CASE("ApplyRope rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(4096);
  RopeParams p;
  p.q = p.k = buffer.as<float>();
  p.positions = buffer.as<int32_t>();
  p.cos = p.sin = buffer.as<float>();
  p.max_positions = 4;
  p.num_tokens = 1;
  p.num_q_heads = p.num_kv_heads = 1;
  p.head_dim = 8;
  SECTION("odd head_dim") {
    p.head_dim = 7;
    RequireBadField(ApplyRope(p, nullptr), "head_dim");
  }
  SECTION("stride") {
    p.q_stride = 4;
    RequireBadField(ApplyRope(p, nullptr), "q_stride");
  }
  SECTION("table") {
    p.sin = nullptr;
    RequireBadField(ApplyRope(p, nullptr), "sin");
  }
}

}  // namespace
}  // namespace kvserve::cuda
