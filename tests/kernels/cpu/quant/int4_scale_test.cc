// The int4 quantizer's choice of group scales (QuantMatrix::Quantize,
// kernels/cpu/quant/quant_matrix.cc Int4GroupScale): every group's squared
// reconstruction error is at most that of the plain max-scale quantizer
// (the largest |w| maps to -8, llama.cpp's q4_0) and of the shrinking search
// that came before the least-squares refits, on Gaussian and on
// heavy-tailed (Student t, 3 degrees of freedom) weights, for groups of 32
// and 128 and a partial last group. Both references are among the
// candidates and all three errors come from Int4GroupError, the quantizer's
// own comparison, so this holds exactly; over thousands of groups the
// search must also lower the total error.
// int4_asym's scale and offset: no group's error above int4's, which is its
// first candidate.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/cpu/quant/quant_matrix.h"

namespace kvserve::cpu {
namespace {

// The largest-magnitude weight, with its sign.
float SignedMax(const float* w, int64_t n) {
  float m = 0.0f;
  for (int64_t k = 0; k < n; ++k) m = std::fabs(w[k]) > std::fabs(m) ? w[k] : m;
  return m;
}

double MaxScaleError(const float* w, int64_t n) {
  return Int4GroupError(w, n, Fp16ToFloat(FloatToFp16(SignedMax(w, n) / -8.0f)));
}

// The search before the refits: m f / -8 for f = 1, 0.97, ..., 0.76.
double ShrinkSearchError(const float* w, int64_t n) {
  const float m = SignedMax(w, n);
  double best = -1;
  for (int step = 0; step <= 8; ++step) {
    const float s = Fp16ToFloat(FloatToFp16(m * (1.0f - 0.03f * step) / -8.0f));
    if (s == 0.0f) continue;
    const double e = Int4GroupError(w, n, s);
    if (best < 0 || e < best) best = e;
  }
  return best < 0 ? Int4GroupError(w, n, 0.0f) : best;
}

template <typename Dist>
std::vector<float> Weights(int64_t n, uint32_t seed, Dist dist, float scale) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * static_cast<float>(dist(rng));
  return v;
}

struct Totals {
  double stored = 0, max_scale = 0, shrink = 0;
};

// Quantizes w ([out][in]) and checks every group against both references;
// with require_lower, the total error must also be below the shrinking
// search's.
Totals CheckGroups(const char* what, const std::vector<float>& w, int64_t out, int64_t in,
                   int group, bool require_lower) {
  INFO("out " << out << " in " << in << " group " << group);
  const QuantMatrix m = QuantMatrix::Quantize(w.data(), out, in, QuantKind::kInt4, group);
  Totals t;
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t g = 0; g * group < in; ++g) {
      const int64_t k0 = g * group, n = std::min<int64_t>(group, in - k0);
      const float* wg = w.data() + o * in + k0;
      const float s = m.ScaleAt(o, g);
      double direct = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int q = m.QuantAt(o, k0 + k);
        // The stored levels are the rounding of w / s (as w times 1 / s)
        // under the stored scale.
        const int want =
            s != 0.0f ? std::clamp(static_cast<int>(std::nearbyint(wg[k] * (1.0f / s))), -8, 7) : 0;
        REQUIRE(q == want);
        const double d = double(wg[k]) - double(s) * q;
        direct += d * d;
      }
      // Int4GroupError is that squared error (in other sums).
      const double stored = Int4GroupError(wg, n, s);
      REQUIRE(std::fabs(stored - direct) <= 1e-9 * std::max(direct, 1e-30) + 1e-20);
      const double max_scale = MaxScaleError(wg, n), shrink = ShrinkSearchError(wg, n);
      INFO("channel " << o << " group " << g);
      REQUIRE(stored <= max_scale);
      REQUIRE(stored <= shrink);
      t.stored += stored;
      t.max_scale += max_scale;
      t.shrink += shrink;
    }
  }
  std::printf(
      "int4 %s, group %d, %lldx%lld: squared error %.4g (max scale %.4g, shrink search %.4g: "
      "%.1f%% and %.1f%% lower)\n",
      what, group, static_cast<long long>(out), static_cast<long long>(in), t.stored, t.max_scale,
      t.shrink, 100.0 * (1.0 - t.stored / t.max_scale), 100.0 * (1.0 - t.stored / t.shrink));
  if (require_lower) REQUIRE(t.stored < t.shrink);
  return t;
}

TEST_CASE("int4 group scales: no group's error above the max-scale or the shrinking search",
          "[kernels]") {
  const int64_t out = 96;
  uint32_t seed = 41;
  for (int group : {32, 128}) {
    for (int64_t in : {int64_t{256}, int64_t{172}}) {  // 172: a partial last group
      SECTION("Gaussian weights, group " + std::to_string(group) + ", in " + std::to_string(in)) {
        CheckGroups("Gaussian",
                    Weights(out * in, seed, std::normal_distribution<double>(0.0, 1.0), 0.05f), out,
                    in, group, /*require_lower=*/true);
      }
      SECTION("Student t(3) weights, group " + std::to_string(group) + ", in " +
              std::to_string(in)) {
        CheckGroups("Student t(3)",
                    Weights(out * in, seed + 1, std::student_t_distribution<double>(3.0), 0.05f),
                    out, in, group, /*require_lower=*/true);
      }
      seed += 2;
    }
  }
}

TEST_CASE("int4 group scales: zero, constant and one-outlier groups", "[kernels]") {
  const int group = 32;
  std::vector<float> w(4 * group, 0.0f);
  for (int k = 0; k < group; ++k) w[group + k] = 0.25f;           // constant
  for (int k = 0; k < group; ++k) w[2 * group + k] = 0.001f * k;  // ramp
  w[3 * group + 5] = -3.0f;                                       // one outlier in zeros
  const QuantMatrix m = QuantMatrix::Quantize(w.data(), 4, group, QuantKind::kInt4, group);
  REQUIRE(m.ScaleAt(0, 0) == 0.0f);
  for (int k = 0; k < group; ++k) REQUIRE(m.QuantAt(0, k) == 0);
  // A constant group and a lone outlier are represented exactly.
  for (int k = 0; k < group; ++k) {
    REQUIRE(m.ScaleAt(1, 0) * m.QuantAt(1, k) == 0.25f);
    REQUIRE(m.ScaleAt(3, 0) * m.QuantAt(3, k) == w[3 * group + k]);
  }
  CheckGroups("edge cases", w, 4, group, group, /*require_lower=*/false);
}

TEST_CASE("int4_asym group scales and offsets: no group's error above int4's", "[kernels]") {
  // The symmetric choice is int4_asym's first candidate (offset 0), so its
  // error bounds every group's; offsets pay where a group's values are
  // lopsided, so the total must drop clearly below int4's on shifted ones.
  const int64_t out = 64, in = 172;
  uint32_t seed = 91;
  for (int group : {32, 128}) {
    for (float shift : {0.0f, 0.02f}) {
      std::vector<float> w =
          Weights(out * in, seed++, std::normal_distribution<double>(0, 1), 0.05f);
      for (float& v : w) v += shift;
      INFO("group " << group << " shift " << shift);
      const QuantMatrix sym = QuantMatrix::Quantize(w.data(), out, in, QuantKind::kInt4, group);
      const QuantMatrix asym =
          QuantMatrix::Quantize(w.data(), out, in, QuantKind::kInt4Asym, group);
      double e_sym = 0, e_asym = 0;
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t g = 0; g * group < in; ++g) {
          const int64_t k0 = g * group, n = std::min<int64_t>(group, in - k0);
          const float* wg = w.data() + o * in + k0;
          const float s = asym.ScaleAt(o, g), off = asym.OffsetAt(o, g);
          double direct = 0;
          for (int64_t k = 0; k < n; ++k) {
            const int q = asym.QuantAt(o, k0 + k);
            const int want =
                s != 0.0f ? std::clamp(static_cast<int>(std::nearbyint((wg[k] - off) * (1.0f / s))),
                                       -8, 7)
                          : 0;
            REQUIRE(q == want);
            const double d = double(wg[k]) - (double(s) * q + double(off));
            direct += d * d;
          }
          const double ea = Int4GroupError(wg, n, s, off),
                       es = Int4GroupError(wg, n, sym.ScaleAt(o, g));
          REQUIRE(std::fabs(ea - direct) <= 1e-9 * std::max(direct, 1e-30) + 1e-20);
          INFO("channel " << o << " group " << g);
          REQUIRE(ea <= es);
          e_sym += es;
          e_asym += ea;
        }
      }
      std::printf("int4_asym group %d, shift %.2f: squared error %.4g, int4 %.4g (%.1f%% lower)\n",
                  group, shift, e_asym, e_sym, 100.0 * (1.0 - e_asym / e_sym));
      REQUIRE(e_asym < e_sym);
      if (shift > 0.0f) REQUIRE(e_asym < 0.9 * e_sym);
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
