// Launchers of kernels/cuda through the stand-in, for what the desk check of
// issue 23 changed:
//   - qk_norm: RmsNorm's per-head form normalises every q and k head of a
//     fused QKV row in one launch (Qwen3-8B: 5 layers' worth of 1,440
//     launches a step were one per head), bit for bit what one plain
//     RmsNorm call per head gives;
//   - SwiGLU over more tokens and channels than one grid covers (the 2-D
//     grid-stride loop that replaced the per-element 64-bit / and %);
//   - token masks (constrained decoding) equal to the CPU sampler's
//     Sampler::ApplyMask, bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/layers/ops.h"
#include "kernels/cuda/layers/rms_norm.h"
#include "kernels/cuda/layers/swiglu.h"
#include "kernels/cuda/sampling/token_mask.h"
#include "model/sampling/sampler.h"
#include "tests/cuda_stub/cuda_stub.h"

namespace kvserve::cuda {
namespace {

float* Upload(const std::vector<float>& h) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, h.size() * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, h.data(), h.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  return static_cast<float*>(p);
}
std::vector<float> Download(const float* d, size_t n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

TEST_CASE("stub launchers: qk_norm is one launch for every head, equal to one per head",
          "[cuda_stub][fiber_order]") {
  // 5 tokens of [4 q heads][2 k heads][2 v heads] x head_dim 8, row stride 64.
  const int64_t tokens = 5, q_heads = 4, kv_heads = 2, hd = 8, stride = 64;
  std::vector<float> qkv(static_cast<size_t>(tokens * stride)), qw(hd), kw(hd);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.7f * float(i)) * float(1 + i % 5);
  for (int64_t i = 0; i < hd; ++i) {
    qw[size_t(i)] = 0.5f + 0.1f * float(i);
    kw[size_t(i)] = 2.0f - 0.2f * float(i);
  }
  float* one = Upload(qkv);
  float* each = Upload(qkv);
  float *dq = Upload(qw), *dk = Upload(kw);
  RmsNormParams p;
  p.x = p.out = one;
  p.weight = dq;
  p.weight2 = dk;
  p.weight2_from = q_heads;
  p.heads = q_heads + kv_heads;
  p.num_tokens = tokens;
  p.dim = hd;
  p.x_stride = p.out_stride = stride;
  p.eps = 1e-6f;
  const int64_t before = cuda_stub::GetCounters().kernels_run;
  REQUIRE(RmsNorm(p, nullptr).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cuda_stub::GetCounters().kernels_run - before == 1);
  for (int64_t h = 0; h < q_heads + kv_heads; ++h) {
    RmsNormParams ph;
    ph.x = ph.out = each + h * hd;
    ph.weight = h < q_heads ? dq : dk;
    ph.num_tokens = tokens;
    ph.dim = hd;
    ph.x_stride = ph.out_stride = stride;
    ph.eps = 1e-6f;
    REQUIRE(RmsNorm(ph, nullptr).ok());
  }
  const std::vector<float> a = Download(one, qkv.size()), b = Download(each, qkv.size());
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  // v heads untouched; q heads changed.
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = (q_heads + kv_heads) * hd; i < stride; ++i) {
      REQUIRE(a[size_t(t * stride + i)] == qkv[size_t(t * stride + i)]);
    }
  }
  REQUIRE(a[1] != qkv[1]);
  SECTION("the per-head form refuses a residual and rows shorter than its heads") {
    p.x_stride = p.out_stride = (q_heads + kv_heads) * hd - 1;
    absl::Status s = RmsNorm(p, nullptr);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(s.message().find("x_stride") != std::string_view::npos);
    p.x_stride = p.out_stride = stride;
    p.residual = dq;
    p.out = each;
    s = RmsNorm(p, nullptr);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(s.message().find("heads") != std::string_view::npos);
  }
  for (float* d : {one, each, dq, dk}) cudaFree(d);
}

TEST_CASE("stub launchers: SwiGLU over strided rows equals cpu::SiluMul",
          "[cuda_stub][fiber_order]") {
  // 300 channels: a thread strides over two; rows padded to check strides.
  const int64_t tokens = 7, hidden = 300, in_stride = 2 * hidden + 4, out_stride = hidden + 3;
  std::vector<float> gate_up(size_t(tokens * in_stride)), out0(size_t(tokens * out_stride), -7.0f);
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = 6.0f * std::sin(0.013f * float(i));
  float *dg = Upload(gate_up), *dout = Upload(out0);
  SwiGluParams p;
  p.gate_up = dg;
  p.out = dout;
  p.num_tokens = tokens;
  p.hidden = hidden;
  p.gate_up_stride = in_stride;
  p.out_stride = out_stride;
  p.dtype = ActDtype::kFp32;
  REQUIRE(SwiGlu(p, nullptr).ok());
  const std::vector<float> got = Download(dout, out0.size());
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> g(gate_up.begin() + t * in_stride, gate_up.begin() + t * in_stride + hidden);
    cpu::SiluMul(g.data(), gate_up.data() + t * in_stride + hidden, hidden);
    INFO("token " << t);
    for (int64_t c = 0; c < hidden; ++c) {
      // The device transcribes the AVX2 Exp8; the scalar CPU path uses libm.
      REQUIRE(std::fabs(got[size_t(t * out_stride + c)] - g[size_t(c)]) <=
              1e-5f * (1.0f + std::fabs(g[size_t(c)])));
    }
    for (int64_t c = hidden; c < out_stride; ++c) REQUIRE(got[size_t(t * out_stride + c)] == -7.0f);
  }
  cudaFree(dg);
  cudaFree(dout);
}

TEST_CASE("stub launchers: token masks equal the CPU sampler's mask", "[cuda_stub][fiber_order]") {
  // A vocabulary that is not a multiple of 32, more words than one block's
  // threads, rows with all-ones, all-but-one, sparse and single-bit masks.
  const int32_t vocab = 9000, rows = 5;
  const int64_t words = TokenMaskWords(vocab);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(size_t(rows) * vocab);
  for (float& x : logits) x = normal(rng);
  std::vector<uint32_t> masks(size_t(rows) * words, ~uint32_t{0});
  for (int64_t w = 0; w < words; ++w) {
    masks[size_t(1 * words + w)] = w == 7 ? ~(uint32_t{1} << 5) : ~uint32_t{0};
    masks[size_t(2 * words + w)] = static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
    masks[size_t(3 * words + w)] = w == words - 1 ? uint32_t{1} << ((vocab - 1) % 32) : 0u;
    masks[size_t(4 * words + w)] = w == 0 ? 1u : 0u;
  }
  float* dl = Upload(logits);
  void* dm = nullptr;
  REQUIRE(cudaMalloc(&dm, masks.size() * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(dm, masks.data(), masks.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  TokenMaskParams p;
  p.logits = dl;
  p.masks = static_cast<const uint32_t*>(dm);
  p.vocab = vocab;
  p.num_rows = rows;
  REQUIRE(ApplyTokenMasks(p, nullptr).ok());
  const std::vector<float> got = Download(dl, logits.size());
  for (int r = 0; r < rows; ++r) {
    std::vector<float> want(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    Sampler::ApplyMask(want, std::span<const uint32_t>(masks.data() + r * words, size_t(words)));
    INFO("row " << r);
    REQUIRE(std::memcmp(got.data() + size_t(r) * vocab, want.data(), size_t(vocab) * 4) == 0);
  }
  p.vocab = 0;
  REQUIRE(ApplyTokenMasks(p, nullptr).code() == absl::StatusCode::kInvalidArgument);
  cudaFree(dl);
  cudaFree(dm);
}

}  // namespace
}  // namespace kvserve::cuda
