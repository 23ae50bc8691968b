// QuantLinear (kernels/cpu/quant/quant_matrix.h) against float64 references
// on odd shapes (inner dimensions that are not multiples of 4, 8, 16 or 32;
// 1, 3 and 17 rows), for every kernel this CPU can run (the others are
// skipped with a message). Three checks per shape:
//   1. every kernel gives the scalar kernel's bits (the integers are exact
//      and the float operations the same);
//   2. the result equals the float64 dot product of the quantized values the
//      kernel used (the stored q and scales, the activation quantization)
//      within the float rounding of its last operations;
//   3. it is within the error the quantization allows of the float64 product
//      of the original x and W: sum_k |x_k| e_w + |w_k| e_x + e_x e_w, with
//      e_x = t / 2 and e_w = |s| / 2 (half a quantization step; for an int4
//      weight clipped to [-8, 7] s, its distance to the range), plus the
//      float rounding of 2.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quant/quant_matrix.h"

namespace kvserve::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<QuantKernel> Kernels() {
  std::vector<QuantKernel> ks;
  for (QuantKernel k : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kVnni512}) {
    if (QuantKernelAvailable(k)) {
      ks.push_back(k);
    } else {
      std::printf("quant_gemm_test: skipping the %s kernel: this CPU lacks it\n",
                  std::string(QuantKernelName(k)).c_str());
    }
  }
  return ks;
}

struct Shape {
  int64_t rows, in, out;
};

// Runs every check above for one shape and kind.
void CheckShape(const Shape& sh, QuantKind kind, int group, uint32_t seed) {
  INFO("rows " << sh.rows << " in " << sh.in << " out " << sh.out << " kind "
               << std::string(QuantKindName(kind)) << " group " << group);
  const std::vector<float> x = RandomVec(sh.rows * sh.in, seed, 1.0f);
  const std::vector<float> w = RandomVec(sh.out * sh.in, seed + 1, 0.05f);
  const QuantMatrix m = QuantMatrix::Quantize(w.data(), sh.out, sh.in, kind, group);
  REQUIRE(m.out() == sh.out);
  REQUIRE(m.in() == sh.in);
  const int64_t kp = m.k_padded();
  REQUIRE(kp >= sh.in);
  REQUIRE(kp % (kind == QuantKind::kInt8 ? 4 : group) == 0);
  if (kind != QuantKind::kInt4Asym) {
    for (int64_t o = 0; o < sh.out; ++o) REQUIRE(m.OffsetAt(o, 0) == 0.0f);
  }
  const int lo_q = kind == QuantKind::kInt8 ? -127 : -8, hi_q = kind == QuantKind::kInt8 ? 127 : 7;
  // The weight as stored: s q (+ o, int4_asym's group offset).
  auto stored = [&](int64_t o, int64_t k) {
    const int64_t g = k / m.group_size();
    return double(m.ScaleAt(o, g)) * m.QuantAt(o, k) + double(m.OffsetAt(o, g));
  };
  // Half a step, or for a weight past the range (int4 clips its extreme
  // where that lowers the group's error) its distance to the end of it.
  auto weight_error = [&](double wv, double s, double off) {
    if (s == 0) return std::fabs(wv - off);
    const double r = (wv - off) / s;
    return std::fabs(s) * std::max({0.5, r - hi_q, lo_q - r}) + 2 * kU * std::fabs(wv);
  };
  const int64_t gsize = m.group_size();

  // The stored weights are within half a step of the originals.
  for (int64_t o = 0; o < sh.out; ++o) {
    for (int64_t k = 0; k < kp; ++k) {
      const int q = m.QuantAt(o, k);
      REQUIRE(q >= lo_q);
      REQUIRE(q <= hi_q);
      if (k >= sh.in) {
        REQUIRE(q == 0);
        continue;
      }
      const double s = m.ScaleAt(o, k / gsize), off = m.OffsetAt(o, k / gsize);
      const double wv = w[o * sh.in + k];
      REQUIRE(std::fabs(wv - stored(o, k)) <= weight_error(wv, s, off));
    }
  }

  // The activations, as the kernels quantize them: x ~ t (128 hi + lo).
  const int64_t groups = kp / gsize;
  std::vector<int8_t> hi(sh.rows * kp);
  std::vector<uint8_t> lo(sh.rows * kp);
  std::vector<float> t(sh.rows);
  std::vector<int32_t> sums_h(sh.rows * groups), sums_l(sh.rows * groups);
  for (int64_t r = 0; r < sh.rows; ++r) {
    QuantizeActivationRow(x.data() + r * sh.in, sh.in, kp, static_cast<int>(gsize),
                          hi.data() + r * kp, lo.data() + r * kp, &t[r], sums_h.data() + r * groups,
                          sums_l.data() + r * groups);
    for (int64_t k = 0; k < kp; ++k) {
      REQUIRE(std::abs(hi[r * kp + k]) <= 127);
      REQUIRE(lo[r * kp + k] <= 127);
      if (k >= sh.in) REQUIRE(128 * hi[r * kp + k] + lo[r * kp + k] == 0);
    }
    for (int64_t k = 0; k < sh.in; ++k) {
      const double xv = x[r * sh.in + k];
      const double v = 128.0 * hi[r * kp + k] + lo[r * kp + k];
      REQUIRE(std::fabs(xv - double(t[r]) * v) <= t[r] / 2.0 + 2 * kU * std::fabs(xv));
    }
  }

  // Outputs [o0, o1): all of them, and a range that starts and ends inside blocks.
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, sh.out}};
  if (sh.out > 5) ranges.push_back({3, sh.out - 2});
  const int64_t ldy = sh.out + 3;
  for (auto [o0, o1] : ranges) {
    for (bool accumulate : {false, true}) {
      INFO("outputs [" << o0 << ", " << o1 << ") accumulate " << accumulate);
      const std::vector<float> y0 = RandomVec(sh.rows * ldy, seed + 2, 1.0f);
      std::vector<float> ref_bits;
      for (QuantKernel kern : Kernels()) {
        INFO("kernel " << std::string(QuantKernelName(kern)));
        std::vector<float> y = y0;
        QuantLinear(x.data(), sh.rows, m, o0, o1, y.data(), ldy, accumulate, kern);
        // Only [o0, o1) of each row is written.
        for (int64_t r = 0; r < sh.rows; ++r) {
          for (int64_t c = 0; c < ldy; ++c) {
            if (c < o1 - o0) continue;
            REQUIRE(std::memcmp(&y[r * ldy + c], &y0[r * ldy + c], sizeof(float)) == 0);
          }
        }
        if (ref_bits.empty()) {
          ref_bits = y;
        } else {
          REQUIRE(std::memcmp(y.data(), ref_bits.data(), y.size() * sizeof(float)) == 0);
        }
        for (int64_t r = 0; r < sh.rows; ++r) {
          for (int64_t o = o0; o < o1; ++o) {
            double dq = 0, dq_abs = 0, exact = 0, qbound = 0;
            for (int64_t g = 0; g < groups; ++g) {
              const double s = m.ScaleAt(o, g), off = m.OffsetAt(o, g);
              double acc_h = 0, acc_l = 0, sum_h = 0, sum_l = 0;
              for (int64_t k = g * gsize; k < (g + 1) * gsize; ++k) {
                acc_h += double(hi[r * kp + k]) * m.QuantAt(o, k);
                acc_l += double(lo[r * kp + k]) * m.QuantAt(o, k);
                sum_h += hi[r * kp + k];
                sum_l += lo[r * kp + k];
                if (k >= sh.in) continue;
                const double xv = x[r * sh.in + k], wv = w[o * sh.in + k];
                const double ex = t[r] / 2.0 + 2 * kU * std::fabs(xv);
                const double ew = weight_error(wv, s, off);
                exact += xv * wv;
                qbound += std::fabs(xv) * ew + std::fabs(wv) * ex + ex * ew;
              }
              dq += ((128 * acc_h + acc_l) * s + (128 * sum_h + sum_l) * off) * t[r];
              dq_abs += ((std::fabs(128 * acc_h) + std::fabs(acc_l)) * std::fabs(s) +
                         (std::fabs(128 * sum_h) + std::fabs(sum_l)) * std::fabs(off)) *
                        t[r];
            }
            // int8: roundings of the int-to-float conversions, the
            // recombination, s * t and the product; int4: the conversions
            // and recombination per group, its fma, and the final multiply;
            // int4_asym: a second fma per group.
            const double per_group = kind == QuantKind::kInt4Asym ? 4 : 2;
            const double fbound =
                (kind == QuantKind::kInt8 ? 6 : per_group * double(groups) + 4) * kU * dq_abs +
                1e-30;
            const double base = accumulate ? double(y0[r * ldy + (o - o0)]) : 0.0;
            const double got = double(y[r * ldy + (o - o0)]) - base;
            const double add_bound = accumulate ? kU * std::fabs(y[r * ldy + (o - o0)]) : 0.0;
            INFO("row " << r << " output " << o);
            REQUIRE(std::fabs(got - dq) <= fbound + add_bound);
            REQUIRE(std::fabs(got - exact) <= qbound + fbound + add_bound);
          }
        }
      }
    }
  }
}

const Shape kShapes[] = {{1, 1, 1},    {1, 13, 7},  {3, 37, 16},  {17, 100, 33}, {1, 172, 64},
                         {3, 172, 48}, {17, 61, 5}, {1, 300, 40}, {3, 7, 129},   {17, 255, 20}};

TEST_CASE("KVSERVE_CPU_ISA=avx2 or scalar keeps the weight GEMMs off AVX-512", "[kernels]") {
  // avx2 and scalar pin the process below AVX-512 (a comparison run at
  // KVSERVE_CPU_ISA=avx2 must run the AVX2 weight GEMMs too); unset, empty
  // and auto take VNNI where the CPU has it.
  REQUIRE_FALSE(Avx512AllowedFor("avx2"));
  REQUIRE_FALSE(Avx512AllowedFor("scalar"));
  for (const char* unpinned : {static_cast<const char*>(nullptr), "", "auto"}) {
    REQUIRE(Avx512AllowedFor(unpinned) == CpuHasAvx512Vnni());
  }
  const char* env = std::getenv("KVSERVE_CPU_ISA");
  const bool pinned =
      env != nullptr && (std::strcmp(env, "avx2") == 0 || std::strcmp(env, "scalar") == 0);
  if (pinned) REQUIRE(BestQuantKernel() != QuantKernel::kVnni512);
  if (env != nullptr && std::strcmp(env, "scalar") == 0)
    REQUIRE(BestQuantKernel() == QuantKernel::kScalar);
}

TEST_CASE("QuantLinear int8: each kernel equals scalar and a float64 reference within bounds",
          "[kernels]") {
  uint32_t seed = 1;
  for (const Shape& sh : kShapes) CheckShape(sh, QuantKind::kInt8, 0, seed += 7);
}

TEST_CASE("QuantLinear int4 group 32: each kernel equals scalar and a float64 reference",
          "[kernels]") {
  uint32_t seed = 100;
  for (const Shape& sh : kShapes) CheckShape(sh, QuantKind::kInt4, 32, seed += 7);
}

TEST_CASE(
    "QuantLinear int4_asym groups 32, 128 and 8: each kernel equals scalar and a float64 "
    "reference",
    "[kernels]") {
  uint32_t seed = 300;
  for (const Shape& sh : kShapes) CheckShape(sh, QuantKind::kInt4Asym, 32, seed += 7);
  for (const Shape& sh : {Shape{1, 172, 40}, Shape{3, 300, 17}, Shape{17, 129, 16}}) {
    CheckShape(sh, QuantKind::kInt4Asym, 128, seed += 7);
    CheckShape(sh, QuantKind::kInt4Asym, 8, seed += 7);
  }
}

TEST_CASE("QuantLinear int4 group 128 and 8: inputs not a multiple of the group", "[kernels]") {
  uint32_t seed = 200;
  for (const Shape& sh : {Shape{1, 172, 40}, Shape{3, 300, 17}, Shape{17, 129, 16}}) {
    CheckShape(sh, QuantKind::kInt4, 128, seed += 7);
    CheckShape(sh, QuantKind::kInt4, 8, seed += 7);
  }
}

TEST_CASE("QuantLinear: a zero row gives zeros and large inputs do not overflow", "[kernels]") {
  // K = 4099 with every product at its extreme (v = 16256, q = +-127 or
  // +-7: weights +-1 and 0 quantize exactly at both widths), far from
  // int32's limit, and a row of zeros (scale 0).
  const int64_t in = 4099, out = 19;
  std::vector<float> w(out * in), x(2 * in, 0.0f);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) w[o * in + k] = k % 3 ? (o % 2 ? -1.0f : 1.0f) : 0.0f;
  }
  for (int64_t k = 0; k < in; ++k) x[in + k] = 2.0f;
  for (QuantKind kind : {QuantKind::kInt8, QuantKind::kInt4, QuantKind::kInt4Asym}) {
    const QuantMatrix m = QuantMatrix::Quantize(w.data(), out, in, kind, 32);
    for (QuantKernel kern : Kernels()) {
      INFO(std::string(QuantKindName(kind)) << " " << std::string(QuantKernelName(kern)));
      std::vector<float> y(2 * out, -1.0f);
      QuantLinear(x.data(), 2, m, 0, out, y.data(), out, false, kern);
      for (int64_t o = 0; o < out; ++o) {
        REQUIRE(y[o] == 0.0f);
        double exact = 0;
        for (int64_t k = 0; k < in; ++k) exact += 2.0 * w[o * in + k];
        // Exact integers; int4's scale is fp16(1/7) (relative error 2^-11).
        const double bound = (kind == QuantKind::kInt8 ? 1e-5 : 1e-3) * std::fabs(exact);
        REQUIRE(std::fabs(y[out + o] - exact) <= bound);
      }
    }
  }
}

TEST_CASE("QuantLinear int4: the largest nibbles and activations fit every kernel's sums",
          "[kernels]") {
  // Per group one weight -1 (the scale: 1 / 8, q = -8) and the others 7 / 8
  // (q = 7, nibble 15), all activations equal (high byte 127): every
  // vpmaddubsw pair is 2 x 15 x 127, the most the AVX2 kernel's int16 sums
  // (four quad pairs) can take; eight would overflow.
  for (int group : {32, 128}) {
    const int64_t in = 2 * group, out = 24;
    std::vector<float> w(out * in), x(in, 2.0f);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t k = 0; k < in; ++k) w[o * in + k] = k % group == 0 ? -1.0f : 0.875f;
    }
    const QuantMatrix m = QuantMatrix::Quantize(w.data(), out, in, QuantKind::kInt4, group);
    REQUIRE(m.QuantAt(0, 0) == -8);
    REQUIRE(m.QuantAt(0, 1) == 7);
    double exact = 0;
    for (int64_t k = 0; k < in; ++k) exact += 2.0 * w[k];
    for (QuantKernel kern : Kernels()) {
      INFO("group " << group << " " << std::string(QuantKernelName(kern)));
      std::vector<float> y(out, 0.0f);
      QuantLinear(x.data(), 1, m, 0, out, y.data(), out, false, kern);
      for (int64_t o = 0; o < out; ++o) REQUIRE(std::fabs(y[o] - exact) <= 1e-5 * std::fabs(exact));
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
