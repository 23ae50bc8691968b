#include "kernels/cpu/kv/kv_quant.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cache/format/kv_format.h"
#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvserve::cpu {
namespace {

float FloatOf(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t HardwareFp16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

// The layout of one part (K) of a one-head format, for row-level calls.
KvPartLayout PartOf(KvDtype dtype, int head_dim, int group = 64) {
  absl::StatusOr<KvFormat> f = KvFormat::Create(dtype, 1, head_dim, 1, group);
  REQUIRE(f.ok());
  return f->k();
}

struct Row {
  std::vector<uint8_t> data, meta;
  std::vector<float> back;
};

Row RoundTrip(const KvPartLayout& part, int head_dim, const std::vector<float>& x,
              CpuIsa isa = CpuIsa::kScalar) {
  Row r;
  r.data.assign(part.row_bytes, 0xcd);
  r.meta.assign(std::max(part.meta_bytes, 1), 0xcd);
  QuantizeRow(part, head_dim, x.data(), r.data.data(), r.meta.data(), isa);
  r.back.resize(head_dim);
  DequantizeRow(part, head_dim, r.data.data(), r.meta.data(), r.back.data());
  return r;
}

float MetaFloat(const Row& r, int i = 0) {
  float s;
  std::memcpy(&s, r.meta.data() + 4 * i, 4);
  return s;
}

// Random rows of every kind the tests sweep: gaussian at several magnitudes,
// with and without a bias, plus the edge cases.
std::vector<std::vector<float>> TestRows(int head_dim, std::mt19937* rng) {
  std::vector<std::vector<float>> rows;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float mag : {1e-3f, 0.37f, 1.0f, 25.0f, 300.0f}) {
    for (float bias : {0.0f, 2.0f}) {
      for (int rep = 0; rep < 8; ++rep) {
        std::vector<float> x(head_dim);
        for (float& v : x) v = mag * (normal(*rng) + bias);
        rows.push_back(x);
      }
    }
  }
  rows.push_back(std::vector<float>(head_dim, 0.0f));  // all zeros
  std::vector<float> outlier(head_dim);
  for (float& v : outlier) v = 1e-3f * normal(*rng);
  outlier[head_dim / 2 + 1] = 1000.0f;  // a single outlier
  rows.push_back(outlier);
  std::vector<float> negative(head_dim);
  for (float& v : negative) v = -1.0f - std::fabs(normal(*rng));  // negative only
  rows.push_back(negative);
  rows.push_back(std::vector<float>(head_dim, -3.25f));  // constant
  return rows;
}

float AbsMax(const std::vector<float>& x) {
  float a = 0.0f;
  for (float v : x) a = std::max(a, std::fabs(v));
  return a;
}

TEST_CASE("fp16 codec is exact IEEE round-to-nearest-even", "[kernels][kv_quant]") {
  SECTION("every finite fp16 value survives a round trip") {
    for (uint32_t h = 0; h < 65536; ++h) {
      if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN
      REQUIRE(FloatToFp16(Fp16ToFloat(static_cast<uint16_t>(h))) == h);
    }
  }
  SECTION("ties go to even, overflow goes to inf, tiny values to subnormals") {
    REQUIRE(FloatToFp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
    REQUIRE(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
    REQUIRE(FloatToFp16(65504.0f) == 0x7bff);
    REQUIRE(FloatToFp16(65519.0f) == 0x7bff);
    REQUIRE(FloatToFp16(65520.0f) == 0x7c00);
    REQUIRE(FloatToFp16(-1e9f) == 0xfc00);
    REQUIRE(FloatToFp16(std::ldexp(1.0f, -24)) == 0x0001);
    REQUIRE(FloatToFp16(std::ldexp(1.0f, -25)) == 0x0000);
    REQUIRE(FloatToFp16(3 * std::ldexp(1.0f, -25)) == 0x0002);
    REQUIRE(FloatToFp16(std::ldexp(1.0f, -14)) == 0x0400);
    REQUIRE(FloatToFp16(-0.0f) == 0x8000);
    REQUIRE(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  }
#if defined(__x86_64__)
  SECTION("matches the F16C instruction on a sweep of all float bit patterns") {
    if (!CpuHasAvx2()) {
      WARN("no F16C on this CPU: hardware comparison skipped");
      return;
    }
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 997) {
      const float x = FloatOf(static_cast<uint32_t>(u));
      if (std::isnan(x)) continue;
      REQUIRE(FloatToFp16(x) == HardwareFp16(x));
    }
  }
#endif
}

TEST_CASE("bf16 codec rounds to nearest even", "[kernels][kv_quant]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0) continue;  // NaN
    REQUIRE(FloatToBf16(Bf16ToFloat(static_cast<uint16_t>(h))) == h);
  }
  REQUIRE(FloatToBf16(FloatOf(0x3f808000)) == 0x3f80);  // tie, even below
  REQUIRE(FloatToBf16(FloatOf(0x3f818000)) == 0x3f82);  // tie, even above
  REQUIRE(FloatToBf16(FloatOf(0x3f808001)) == 0x3f81);
  REQUIRE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST_CASE("fp8 e4m3 codec is OCP E4M3FN with saturation", "[kernels][kv_quant]") {
  SECTION("known codes") {
    REQUIRE(Fp8E4m3ToFloat(0x7e) == 448.0f);
    REQUIRE(Fp8E4m3ToFloat(0xfe) == -448.0f);
    REQUIRE(Fp8E4m3ToFloat(0x38) == 1.0f);
    REQUIRE(Fp8E4m3ToFloat(0x08) == std::ldexp(1.0f, -6));
    REQUIRE(Fp8E4m3ToFloat(0x07) == 7 * std::ldexp(1.0f, -9));
    REQUIRE(Fp8E4m3ToFloat(0x01) == std::ldexp(1.0f, -9));
    REQUIRE(std::isnan(Fp8E4m3ToFloat(0x7f)));
    REQUIRE(std::isnan(Fp8E4m3ToFloat(0xff)));
  }
  SECTION("every non-NaN code survives a round trip") {
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      REQUIRE(FloatToFp8E4m3(Fp8E4m3ToFloat(static_cast<uint8_t>(c))) == c);
    }
  }
  SECTION("out of range saturates to 448; there is no inf") {
    REQUIRE(FloatToFp8E4m3(448.0f) == 0x7e);
    REQUIRE(FloatToFp8E4m3(470.0f) == 0x7e);
    REQUIRE(FloatToFp8E4m3(1e30f) == 0x7e);
    REQUIRE(FloatToFp8E4m3(-INFINITY) == 0xfe);
    REQUIRE(FloatToFp8E4m3(std::nanf("")) == 0x7f);
  }
  SECTION("ties go to even, in the normal and the subnormal range") {
    REQUIRE(FloatToFp8E4m3(1.0625f) == 0x38);
    REQUIRE(FloatToFp8E4m3(1.1875f) == 0x3a);
    REQUIRE(FloatToFp8E4m3(std::ldexp(1.0f, -10)) == 0x00);
    REQUIRE(FloatToFp8E4m3(3 * std::ldexp(1.0f, -10)) == 0x02);
    REQUIRE(FloatToFp8E4m3(15 * std::ldexp(1.0f, -10)) == 0x08);  // 7.5 ulp -> 2^-6
  }
  SECTION("random values land on the nearest representable value") {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-448.0f, 448.0f);
    for (int i = 0; i < 20000; ++i) {
      const float x = i % 2 ? u(rng) : u(rng) / 4096.0f;
      const float got = Fp8E4m3ToFloat(FloatToFp8E4m3(x));
      float best = INFINITY;
      for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) continue;
        best = std::min(best, std::fabs(Fp8E4m3ToFloat(static_cast<uint8_t>(c)) - x));
      }
      REQUIRE(std::fabs(got - x) == best);
    }
  }
}

TEST_CASE("row round trips stay within analytic error bounds", "[kernels][kv_quant]") {
  std::mt19937 rng(1234);
  for (int head_dim : {8, 64, 128}) {
    const std::vector<std::vector<float>> rows = TestRows(head_dim, &rng);
    SECTION("fp32 is exact, hd " + std::to_string(head_dim)) {
      const KvPartLayout part = PartOf(KvDtype::kFp32, head_dim);
      for (const auto& x : rows) REQUIRE(RoundTrip(part, head_dim, x).back == x);
    }
    SECTION("fp16: half an ulp (2^-11 relative, 2^-25 absolute below 2^-14), hd " +
            std::to_string(head_dim)) {
      const KvPartLayout part = PartOf(KvDtype::kFp16, head_dim);
      for (const auto& x : rows) {
        const Row r = RoundTrip(part, head_dim, x);
        for (int d = 0; d < head_dim; ++d) {
          const float bound =
              std::max(std::fabs(x[d]) * std::ldexp(1.0f, -11), std::ldexp(1.0f, -25));
          REQUIRE(std::fabs(r.back[d] - x[d]) <= bound);
        }
      }
    }
    SECTION("bf16: half an ulp (2^-8 relative), hd " + std::to_string(head_dim)) {
      const KvPartLayout part = PartOf(KvDtype::kBf16, head_dim);
      for (const auto& x : rows) {
        const Row r = RoundTrip(part, head_dim, x);
        for (int d = 0; d < head_dim; ++d) {
          REQUIRE(std::fabs(r.back[d] - x[d]) <= std::fabs(x[d]) * std::ldexp(1.0f, -8));
        }
      }
    }
    SECTION("int8: scale = amax/127 and |err| <= scale/2, hd " + std::to_string(head_dim)) {
      const KvPartLayout part = PartOf(KvDtype::kInt8, head_dim);
      for (const auto& x : rows) {
        const Row r = RoundTrip(part, head_dim, x);
        const float scale = MetaFloat(r);
        REQUIRE(scale == AbsMax(x) / 127.0f);
        // Slack of 1e-4 relative covers the float division and q * scale.
        for (int d = 0; d < head_dim; ++d) {
          REQUIRE(std::fabs(r.back[d] - x[d]) <= 0.5f * scale * (1.0f + 1e-4f));
          const int q = static_cast<int8_t>(r.data[d]);
          REQUIRE((q >= -127 && q <= 127));
        }
        if (scale == 0.0f) {
          for (float v : r.back) REQUIRE(v == 0.0f);
        }
      }
    }
    SECTION("fp8: half an e4m3 ulp of x/scale, times the chosen scale, hd " +
            std::to_string(head_dim)) {
      const KvPartLayout part = PartOf(KvDtype::kFp8E4m3, head_dim);
      for (const auto& x : rows) {
        const Row r = RoundTrip(part, head_dim, x);
        const float scale = MetaFloat(r);
        // scale = amax / 448 times 1 or sqrt(2), whichever gives the row the
        // least squared error (up to float rounding of the error sums).
        const float base = AbsMax(x) / 448.0f;
        const float steps[2] = {1.0f, 1.41421356f};
        double chosen = -1.0, least = INFINITY;
        for (float step : steps) {
          const float s = base * step;
          double err = 0.0;
          for (float v : x) {
            const double d = s > 0.0f ? double(Fp8E4m3ToFloat(FloatToFp8E4m3(v / s))) * s - v : v;
            err += d * d;
          }
          least = std::min(least, err);
          if (s == scale) chosen = err;
        }
        if (base > 0.0f) {
          REQUIRE(chosen >= 0.0);
          REQUIRE(chosen <= least * (1.0 + 1e-5));
        } else {
          REQUIRE(scale == 0.0f);
        }
        for (int d = 0; d < head_dim; ++d) {
          float bound = 0.0f;
          if (scale > 0.0f) {
            const float y = std::fabs(x[d] / scale);
            // 3 mantissa bits: half an ulp is 2^(e-4) for y in [2^e, 2^(e+1));
            // below 2^-6 the spacing is the subnormal 2^-9.
            const float half_ulp = y >= std::ldexp(1.0f, -6) ? std::ldexp(1.0f, std::ilogb(y) - 4)
                                                             : std::ldexp(1.0f, -10);
            bound = scale * half_ulp + std::fabs(x[d]) * std::ldexp(1.0f, -22);
          }
          REQUIRE(std::fabs(r.back[d] - x[d]) <= bound);
        }
      }
    }
    for (int group : {8, 32, 64, 128}) {
      if (group > head_dim) continue;
      SECTION("int4 g" + std::to_string(group) +
              ": (max-min)/30 plus fp16 rounding of scale and zero, hd " +
              std::to_string(head_dim)) {
        const KvPartLayout part = PartOf(KvDtype::kInt4, head_dim, group);
        REQUIRE(part.group_size == group);
        for (const auto& x : rows) {
          const Row r = RoundTrip(part, head_dim, x);
          for (int g0 = 0; g0 < head_dim; g0 += group) {
            float mn = x[g0], mx = x[g0];
            for (int d = g0; d < g0 + group; ++d) {
              mn = std::min(mn, x[d]);
              mx = std::max(mx, x[d]);
            }
            uint16_t pair[2];
            std::memcpy(pair, r.meta.data() + (g0 / group) * 4, 4);
            const float s = (mx - mn) / 15.0f;
            REQUIRE(pair[0] == FloatToFp16(s));
            REQUIRE(pair[1] == FloatToFp16(mn));
            // The grid is zero' + q scale' with the fp16-rounded scale' and
            // zero'. Inside it the error is scale'/2; values the grid misses
            // by clamping (below zero' or above zero' + 15 scale') are off by
            // at most |zero' - min| + 15 |scale' - scale|. fp16 rounding moves
            // a value by at most 2^-11 relative, or 2^-25 when subnormal.
            const float ds = std::max(s * std::ldexp(1.0f, -11), std::ldexp(1.0f, -25));
            const float dz = std::max(std::fabs(mn) * std::ldexp(1.0f, -11), std::ldexp(1.0f, -25));
            const float slack = std::max(std::fabs(mn), std::fabs(mx)) * std::ldexp(1.0f, -20);
            const float bound = s / 2 + 15.5f * ds + dz + slack;
            for (int d = g0; d < g0 + group; ++d) REQUIRE(std::fabs(r.back[d] - x[d]) <= bound);
          }
        }
      }
    }
  }
}

TEST_CASE("row edge cases decode exactly where they can", "[kernels][kv_quant]") {
  const int hd = 64;
  const std::vector<float> zeros(hd, 0.0f);
  for (KvDtype dtype : kAllKvDtypes) {
    if (dtype == KvDtype::kK8V4) continue;
    SECTION(std::string(KvDtypeName(dtype)) + ": all zeros decode to zeros") {
      const Row r = RoundTrip(PartOf(dtype, hd), hd, zeros);
      REQUIRE(r.back == zeros);
    }
  }
  SECTION("int4: a constant group has scale 0 and decodes to its value in fp16") {
    const Row r = RoundTrip(PartOf(KvDtype::kInt4, hd, 32), hd, std::vector<float>(hd, -3.3f));
    for (float v : r.back) REQUIRE(v == Fp16ToFloat(FloatToFp16(-3.3f)));
  }
  SECTION("int8: the outlier itself is exact and the rest round to 0") {
    std::vector<float> x(hd, 1e-4f);
    x[5] = -1000.0f;
    const Row r = RoundTrip(PartOf(KvDtype::kInt8, hd), hd, x);
    REQUIRE(static_cast<int8_t>(r.data[5]) == -127);
    REQUIRE(r.back[5] == Approx(-1000.0f).epsilon(1e-6));
    REQUIRE(r.back[6] == 0.0f);
  }
  SECTION("fp16 saturates instead of storing inf") {
    std::vector<float> x(hd, 1.0f);
    x[0] = 1e6f;
    x[1] = -7e4f;
    const Row r = RoundTrip(PartOf(KvDtype::kFp16, hd), hd, x);
    REQUIRE(r.back[0] == 65504.0f);
    REQUIRE(r.back[1] == -65504.0f);
  }
  SECTION("int4 packs channel 2i in the low nibble") {
    std::vector<float> x(8, 0.0f);
    x[0] = 15.0f;  // q 15 in the low nibble of byte 0, channel 1 stays 0
    x[3] = 15.0f;  // high nibble of byte 1
    const Row r = RoundTrip(PartOf(KvDtype::kInt4, 8), 8, x);
    REQUIRE(r.data[0] == 0x0f);
    REQUIRE(r.data[1] == 0xf0);
    REQUIRE(r.back == x);
  }
}

TEST_CASE("AVX2 and scalar quantizers write identical bytes", "[kernels][kv_quant]") {
  if (!CpuHasAvx2()) {
    WARN("no AVX2 on this CPU: only the scalar path exists");
    return;
  }
  std::mt19937 rng(99);
  for (int hd : {8, 64, 128}) {
    std::vector<std::vector<float>> rows = TestRows(hd, &rng);
    // Values at fp16's edges: subnormal, overflow, exact ties.
    std::vector<float> edge(hd, 0.0f);
    for (int d = 0; d < hd; ++d) edge[d] = std::ldexp(1.0f + (d % 7) / 8.0f, -30 + (d % 50));
    edge[0] = 7e4f;
    edge[1] = -65520.0f;
    edge[2] = 1.0f + std::ldexp(1.0f, -11);
    rows.push_back(edge);
    for (KvDtype dtype : kAllKvDtypes) {
      const KvPartLayout part = PartOf(dtype, hd, 32);
      for (const auto& x : rows) {
        const Row a = RoundTrip(part, hd, x, CpuIsa::kScalar);
        const Row b = RoundTrip(part, hd, x, CpuIsa::kAvx2);
        REQUIRE(a.data == b.data);
        REQUIRE(a.meta == b.meta);
      }
    }
  }
}

TEST_CASE("int4 groups store +0 for a zero minimum or range on both paths", "[kernels][kv_quant]") {
  // Groups whose extremes are signed zeros met in different orders: the
  // scalar loop keeps the first zero it sees, the AVX2 reduction another.
  const int hd = 64, group = 32;
  const KvPartLayout part = PartOf(KvDtype::kInt4, hd, group);
  std::vector<std::vector<float>> rows;
  std::vector<float> zeros(hd, -0.0f);  // all -0 but the first of each group
  zeros[0] = 0.0f;
  zeros[group] = 0.0f;
  rows.push_back(zeros);
  std::vector<float> mixed(hd);  // minimum +-0, then positive values
  for (int d = 0; d < hd; ++d) mixed[d] = d % group == 0 ? 0.0f : (d % 3 == 1 ? -0.0f : 0.25f * d);
  rows.push_back(mixed);
  std::vector<float> negative(hd);  // maximum +-0, then negative values
  for (int d = 0; d < hd; ++d) negative[d] = d % 4 == 0 ? (d % 8 == 0 ? 0.0f : -0.0f) : -0.5f * d;
  rows.push_back(negative);
  std::vector<CpuIsa> paths = {CpuIsa::kScalar};
  if (CpuHasAvx2()) paths.push_back(CpuIsa::kAvx2);
  for (size_t r = 0; r < rows.size(); ++r) {
    INFO("row " << r);
    const Row want = RoundTrip(part, hd, rows[r], CpuIsa::kScalar);
    for (CpuIsa isa : paths) {
      INFO(CpuIsaName(isa));
      const Row got = RoundTrip(part, hd, rows[r], isa);
      REQUIRE(got.data == want.data);
      REQUIRE(got.meta == want.meta);
      for (int g = 0; g < hd / group; ++g) {
        uint16_t scale_h, zero_h;
        std::memcpy(&scale_h, got.meta.data() + 4 * g, 2);
        std::memcpy(&zero_h, got.meta.data() + 4 * g + 2, 2);
        if (r == 0) REQUIRE(scale_h == 0x0000);  // +0: a constant group
        if (r != 2) REQUIRE(zero_h == 0x0000);   // +0: the group's minimum is a zero
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
