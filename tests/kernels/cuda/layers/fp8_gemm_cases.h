// The fp8 quantizer and GEMM cases shared by the stand-in's tests
// (tests/cuda_stub/cuda_fp8_stub_test.cc, make test) and the [gpu] suite
// (tests/kernels/cuda/layers/fp8_gemm_test.cc, on a device): the same inputs and
// checks, with the accumulation bound each passes.
//   - QuantizeRowsFp8 writes, bit for bit, what the host weight quantizer
//     (Fp8Matrix::Quantize) makes of the same bf16 / fp16 rows, zero codes
//     in the padding, scale 0 for a row of zeros;
//   - the fp8 GEMM (per-channel weight and per-token activation scales,
//     cuBLASLt's outer-vector scaling) against a float64 product of the
//     very codes and scales, on odd shapes (1, 3 and 17 rows; inputs of 13,
//     172 and 257 padded to 16, 176 and 272), with the bias and the residual
//     add, and against the unquantized product within e4m3's own error;
//   - fp32 logits, and a row's y the same bits in any batch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/cuda/layers/fp8_rows.h"
#include "kernels/cuda/layers/gemm.h"
#include "model/loader/quantize_weights.h"
#include "model/loader/safetensors.h"

namespace kvserve::cuda::fp8_cases {

template <typename T>
T* Upload(const std::vector<T>& h) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

inline int64_t Pad16(int64_t n) { return (n + 15) / 16 * 16; }

// Activations as the runner holds them: 16-bit values (their fp32 copy is
// what both quantizers read).
struct Bf16Rows {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
inline Bf16Rows RandomBf16(int64_t n, std::mt19937& rng, float spread) {
  std::normal_distribution<float> d(0.0f, spread);
  Bf16Rows r;
  for (int64_t i = 0; i < n; ++i) {
    r.bits.push_back(Fp32ToBf16(d(rng)));
    r.values.push_back(Bf16ToFp32(r.bits.back()));
  }
  return r;
}

// Fp8Matrix's codes with each row padded to `ld` bytes of zero codes.
inline std::vector<uint8_t> PaddedCodes(const Fp8Matrix& m, int64_t ld) {
  std::vector<uint8_t> out(static_cast<size_t>(m.rows * ld), 0);
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(out.data() + r * ld, m.codes.data() + r * m.cols, m.cols);
  }
  return out;
}

// QuantizeRowsFp8's bytes against the host quantizer's, bf16 and fp16 rows.
inline void RequireQuantizerBytes() {
  std::mt19937 rng(7);
  for (const auto& [cols, dtype] : {std::pair{int64_t{13}, ActDtype::kBf16},
                                    {int64_t{172}, ActDtype::kBf16},
                                    {int64_t{257}, ActDtype::kFp16},
                                    {int64_t{1500}, ActDtype::kBf16}}) {
    DYNAMIC_SECTION("cols " << cols << (dtype == ActDtype::kFp16 ? " fp16" : " bf16")) {
      const int64_t rows = 5, ldq = Pad16(cols);
      Bf16Rows x = RandomBf16(rows * cols, rng, 3.0f);
      // Row 2 all zeros; row 3 one huge value among tiny ones (subnormal codes).
      for (int64_t c = 0; c < cols; ++c) {
        x.values[2 * cols + c] = 0.0f;
        x.values[3 * cols + c] = c == 0 ? 1000.0f : 1e-3f * static_cast<float>(c % 7);
      }
      for (size_t i = 0; i < x.values.size(); ++i) {
        const bool f16 = dtype == ActDtype::kFp16;
        x.bits[i] = f16 ? Fp32ToFp16(x.values[i]) : Fp32ToBf16(x.values[i]);
        x.values[i] = f16 ? Fp16ToFp32(x.bits[i]) : Bf16ToFp32(x.bits[i]);
      }
      uint16_t* dx = Upload(x.bits);
      std::vector<uint8_t> poison(static_cast<size_t>(rows * ldq), 0xa5);
      uint8_t* dq = Upload(poison);
      float* ds = Upload(std::vector<float>(rows, -1.0f));
      REQUIRE(QuantizeRowsFp8({.x = dx,
                               .q = dq,
                               .scale = ds,
                               .rows = rows,
                               .cols = cols,
                               .ldq = ldq,
                               .dtype = dtype},
                              nullptr)
                  .ok());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      const Fp8Matrix want = Fp8Matrix::Quantize(x.values.data(), rows, cols);
      REQUIRE(Download(dq, poison.size()) == PaddedCodes(want, ldq));
      REQUIRE(Download(ds, rows) == want.scales);
      REQUIRE(want.scales[2] == 0.0f);
      REQUIRE(want.scales[3] == x.values[3 * cols] / 448.0f);
      cudaFree(dx);
      cudaFree(dq);
      cudaFree(ds);
    }
  }
}

// The fp8 GEMM against a float64 product of its codes and scales. `sum_eps`
// bounds the accumulation's error relative to sum |a b|: in * 2^-24 for the
// stand-in's fp32 sums in order; a device's fp8 tensor cores accumulate
// with fewer bits between their promotions to fp32 (cuBLASLt's default,
// CUBLASLT_MATMUL_DESC_FAST_ACCUM off, promotes; how often is not
// documented), so the [gpu] case passes a looser bound.
inline void RequireFp8Gemm(double sum_eps_per_term, double sum_eps_floor) {
  std::mt19937 rng(11);
  auto gemm = Gemm::Create(ActDtype::kBf16);
  REQUIRE(gemm.ok());
  for (const auto& [rows, in, out] :
       {std::tuple{1, 13, 24}, {3, 172, 64}, {17, 257, 72}, {3, 64, 512}}) {
    DYNAMIC_SECTION(rows << " x " << in << " -> " << out) {
      const int64_t ld = Pad16(in);
      std::vector<float> w(static_cast<size_t>(out * in));
      std::normal_distribution<float> wd(0.0f, 0.05f);
      for (float& v : w) v = wd(rng);
      const Fp8Matrix wq = Fp8Matrix::Quantize(w.data(), out, in);
      Bf16Rows x = RandomBf16(rows * in, rng, 1.0f);
      std::vector<float> bias_f(static_cast<size_t>(out));
      std::vector<uint16_t> bias(static_cast<size_t>(out)), y0(static_cast<size_t>(rows * out));
      for (int64_t o = 0; o < out; ++o) {
        bias[o] = Fp32ToBf16(0.01f * static_cast<float>(o % 13) - 0.05f);
        bias_f[o] = Bf16ToFp32(bias[o]);
      }
      for (size_t i = 0; i < y0.size(); ++i) y0[i] = Fp32ToBf16(0.25f * static_cast<float>(i % 5));

      uint16_t* dx = Upload(x.bits);
      uint8_t* dxq = Upload(std::vector<uint8_t>(static_cast<size_t>(rows * ld), 0xa5));
      float* dxs = Upload(std::vector<float>(rows, 0.0f));
      uint8_t* dw = Upload(PaddedCodes(wq, ld));
      float* dws = Upload(wq.scales);
      uint16_t* db = Upload(bias);
      uint16_t* dy = Upload(y0);
      REQUIRE(QuantizeRowsFp8({.x = dx,
                               .q = dxq,
                               .scale = dxs,
                               .rows = rows,
                               .cols = in,
                               .ldq = ld,
                               .dtype = ActDtype::kBf16},
                              nullptr)
                  .ok());
      const Fp8Matrix xq = Fp8Matrix::Quantize(x.values.data(), rows, in);
      for (bool with_bias : {false, true}) {
        INFO("bias and residual " << with_bias);
        REQUIRE(cudaMemcpy(dy, y0.data(), y0.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
        REQUIRE((*gemm)
                    ->Linear({.x = dxq,
                              .w = dw,
                              .y = dy,
                              .rows = rows,
                              .in = ld,
                              .out = out,
                              .accumulate = with_bias,
                              .bias = with_bias ? db : nullptr,
                              .y_dtype = ActDtype::kBf16,
                              .w_scale = dws,
                              .x_scale = dxs},
                             nullptr)
                    .ok());
        const std::vector<uint16_t> y = Download(dy, y0.size());
        double worst = 0, worst_fp8 = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < out; ++o) {
            // The product as defined, in float64: exact codes and scales.
            double acc = 0, abs_sum = 0, exact = 0, exact_abs = 0;
            for (int64_t k = 0; k < in; ++k) {
              const double a = cpu::Fp8E4m3ToFloat(xq.codes[r * in + k]) * double(xq.scales[r]);
              const double b = cpu::Fp8E4m3ToFloat(wq.codes[o * in + k]) * double(wq.scales[o]);
              acc += a * b;
              abs_sum += std::abs(a * b);
              exact += double(x.values[r * in + k]) * w[o * in + k];
              exact_abs += std::abs(double(x.values[r * in + k]) * w[o * in + k]);
            }
            double extra = 0;
            if (with_bias) extra = Bf16ToFp32(y0[r * out + o]) + double(bias_f[o]);
            const double got = Bf16ToFp32(y[r * out + o]);
            // One bf16 rounding of the result (2^-9 relative, 2^-8 taken) and
            // the fp32 sum of `in` products (in * 2^-24 of their magnitudes);
            // with a residual and a bias, the epilogue may round the scaled
            // product before it adds them (an H200 did: 4.4 bf16 ulps of a
            // result where the residual cancels the product), one more
            // rounding of |acc| and of each addend.
            const double addends = with_bias
                                       ? (std::abs(acc) + std::abs(Bf16ToFp32(y0[r * out + o])) +
                                          std::abs(double(bias_f[o]))) *
                                             0x1p-8
                                       : 0.0;
            const double tol = std::abs(acc + extra) * 0x1p-8 + addends +
                               std::max(double(in) * sum_eps_per_term, sum_eps_floor) * abs_sum;
            const double err = std::abs(got - (acc + extra));
            worst = std::max(worst, err / (std::abs(acc + extra) + 1e-30));
            INFO("row " << r << " out " << o << ": " << got << " vs " << acc + extra);
            REQUIRE(err <= tol);
            // Against the unquantized product: each e4m3 code is within
            // 2^-4 of its value relative (3 mantissa bits, or an absolute
            // 2^-10 of the row's scale in the subnormal range), so a term
            // moves by at most (1 + 2^-4)^2 - 1 < 0.13 of |x||w|, plus the
            // subnormal floor, plus the bf16 rounding.
            const double fp8_err = std::abs(got - extra - exact);
            worst_fp8 = std::max(worst_fp8, fp8_err / (exact_abs + 1e-30));
            REQUIRE(fp8_err <= 0.13 * exact_abs + std::abs(got) * 0x1p-8 +
                                   double(in) * 0x1p-10 * xq.scales[r] * 448.0 * 0.05 * 5);
          }
        }
        // Measured: worst relative error against the defined product (one
        // bf16 rounding) and of the fp8 result against the exact product
        // normalised by sum |x w|.
        WARN("rows " << rows << " in " << in << " out " << out << ": defined " << worst
                     << ", against unquantized " << worst_fp8);
      }
      for (void* p : std::initializer_list<void*>{dx, dxq, dxs, dw, dws, db, dy}) cudaFree(p);
    }
  }
}

// fp32 logits from an fp16 Gemm, and a row's y the same bits in any batch.
inline void RequireFp8LogitsInvariant(double rel_eps) {
  std::mt19937 rng(5);
  const int64_t in = 64, out = 36;  // out * 4 bytes is a multiple of 16
  std::vector<float> w(static_cast<size_t>(out * in));
  std::normal_distribution<float> wd(0.0f, 0.1f);
  for (float& v : w) v = wd(rng);
  const Fp8Matrix wq = Fp8Matrix::Quantize(w.data(), out, in);
  auto gemm = Gemm::Create(ActDtype::kFp16);
  REQUIRE(gemm.ok());
  uint8_t* dw = Upload(wq.codes);
  float* dws = Upload(wq.scales);
  std::vector<float> first;
  for (int64_t rows : {1, 5, 9}) {
    // Row 0 is the same in every batch; the others differ.
    std::vector<float> xs(static_cast<size_t>(rows * in));
    for (int64_t i = 0; i < rows * in; ++i) {
      xs[i] = i < in ? std::sin(0.3f * float(i)) : std::cos(0.7f * float(i * rows));
    }
    const Fp8Matrix xq = Fp8Matrix::Quantize(xs.data(), rows, in);
    uint8_t* dx = Upload(xq.codes);
    float* dxs = Upload(xq.scales);
    float* dy = Upload(std::vector<float>(static_cast<size_t>(rows * out), 0.0f));
    REQUIRE((*gemm)
                ->Linear({.x = dx,
                          .w = dw,
                          .y = dy,
                          .rows = rows,
                          .in = in,
                          .out = out,
                          .y_dtype = ActDtype::kFp32,
                          .w_scale = dws,
                          .x_scale = dxs},
                         nullptr)
                .ok());
    const std::vector<float> y = Download(dy, static_cast<size_t>(rows * out));
    if (first.empty()) {
      first.assign(y.begin(), y.begin() + out);
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < in; ++k) {
          acc += cpu::Fp8E4m3ToFloat(xq.codes[k]) * double(xq.scales[0]) *
                 cpu::Fp8E4m3ToFloat(wq.codes[o * in + k]) * double(wq.scales[o]);
        }
        REQUIRE(std::abs(first[o] - acc) <= rel_eps * std::abs(acc) + 1e-6);
      }
    } else {
      REQUIRE(std::memcmp(y.data(), first.data(), out * 4) == 0);
    }
    for (void* p : std::initializer_list<void*>{dx, dxs, dy}) cudaFree(p);
  }
  REQUIRE((*gemm)->num_plans() == 1);
  cudaFree(dw);
  cudaFree(dws);
}

}  // namespace kvserve::cuda::fp8_cases
