// The device KV row encoders (kernels/cuda/device/kv_encode.cuh) run on the host
// with a one-thread team and must write exactly the bytes of
// cpu::QuantizeRow (scalar and AVX2 paths) for every format, head_dim and
// int4 group size; the element codecs must equal the CPU's on sweeps of float
// bit patterns. This checks, without a GPU, the code the CUDA KV write runs.
#include "kernels/cuda/device/kv_encode.cuh"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cache/format/kv_format.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cuda::kv_encode {
namespace {

float FloatOfBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint32_t BitsOfFloat(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Rows of every kind: gaussian at several magnitudes and biases, and the
// edge cases (zeros with both signs, a constant, one outlier, values past
// fp16's range, subnormals, exact ties of the int8 grid).
std::vector<std::vector<float>> TestRows(int head_dim, std::mt19937* rng) {
  std::vector<std::vector<float>> rows;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float mag : {1e-6f, 1e-3f, 0.37f, 1.0f, 25.0f, 300.0f, 1e5f}) {
    for (float bias : {0.0f, 2.0f, -5.0f}) {
      for (int rep = 0; rep < 4; ++rep) {
        std::vector<float> x(head_dim);
        for (float& v : x) v = mag * (normal(*rng) + bias);
        rows.push_back(x);
      }
    }
  }
  rows.push_back(std::vector<float>(head_dim, 0.0f));
  std::vector<float> signed_zeros(head_dim);
  for (int i = 0; i < head_dim; ++i) signed_zeros[i] = (i % 3 == 0) ? -0.0f : 0.0f;
  rows.push_back(signed_zeros);
  std::vector<float> zeros_and_one = signed_zeros;
  zeros_and_one[head_dim - 1] = 1.0f;
  rows.push_back(zeros_and_one);
  rows.push_back(std::vector<float>(head_dim, -3.25f));
  std::vector<float> outlier(head_dim);
  for (float& v : outlier) v = 1e-3f * normal(*rng);
  outlier[head_dim / 2] = 1000.0f;
  rows.push_back(outlier);
  std::vector<float> huge(head_dim);
  for (int i = 0; i < head_dim; ++i) huge[i] = (i % 2 ? -1.0f : 1.0f) * (7e4f + 1e3f * i);
  rows.push_back(huge);
  std::vector<float> subnormal(head_dim);
  for (int i = 0; i < head_dim; ++i) subnormal[i] = FloatOfBits(0x00000100u * (i + 1));
  rows.push_back(subnormal);
  std::vector<float> infinite(head_dim);  // what fp16 activations past 65504 become
  for (int i = 0; i < head_dim; ++i)
    infinite[i] = i == 1 ? INFINITY : (i == 0 ? -INFINITY : 0.5f * i);
  rows.push_back(infinite);
  std::vector<float> grid(head_dim);  // k + 0.5 steps of amax / 127: ties in int8
  for (int i = 0; i < head_dim; ++i)
    grid[i] = (i == 0) ? 127.0f : static_cast<float>(i % 20) + 0.5f;
  rows.push_back(grid);
  return rows;
}

KvPartLayout PartOf(KvDtype dtype, bool v_part, int head_dim, int group) {
  absl::StatusOr<KvFormat> f = KvFormat::Create(dtype, 1, head_dim, 1, group);
  REQUIRE(f.ok());
  return v_part ? f->v() : f->k();
}

TEST_CASE("device element codecs equal the CPU's", "[kernels][kv_encode]") {
  SECTION("fp16 and bf16 decoders on every code, fp8 on every byte") {
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint16_t c = static_cast<uint16_t>(h);
      REQUIRE(BitsOfFloat(Fp16ToFloat(c)) == BitsOfFloat(cpu::Fp16ToFloat(c)));
    }
    for (uint32_t b = 0; b < 256; ++b) {
      const uint8_t c = static_cast<uint8_t>(b);
      const float want = cpu::Fp8E4m3ToFloat(c), got = Fp8E4m3ToFloat(c);
      if (std::isnan(want)) {
        REQUIRE(std::isnan(got));
      } else {
        REQUIRE(BitsOfFloat(got) == BitsOfFloat(want));
      }
    }
  }
  SECTION("encoders on a sweep of float bit patterns (NaN and inf included)") {
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
      const float x = FloatOfBits(static_cast<uint32_t>(u));
      REQUIRE(FloatToFp16(x) == cpu::FloatToFp16(x));
      REQUIRE(FloatToBf16(x) == cpu::FloatToBf16(x));
      REQUIRE(FloatToFp8E4m3(x) == cpu::FloatToFp8E4m3(x));
    }
    for (float x : {0.0f, -0.0f, 448.0f, 464.0f, 0.015625f, 0.0146484375f, 65504.0f, 65520.0f,
                    INFINITY, -INFINITY, NAN}) {
      REQUIRE(FloatToFp16(x) == cpu::FloatToFp16(x));
      REQUIRE(FloatToBf16(x) == cpu::FloatToBf16(x));
      REQUIRE(FloatToFp8E4m3(x) == cpu::FloatToFp8E4m3(x));
    }
  }
}

TEST_CASE("EncodeRow writes cpu::QuantizeRow's bytes for every format", "[kernels][kv_encode]") {
  std::mt19937 rng(20240611);
  std::vector<cpu::CpuIsa> isas = {cpu::CpuIsa::kScalar};
  if (cpu::CpuHasAvx2()) isas.push_back(cpu::CpuIsa::kAvx2);
  int rows_checked = 0;
  for (KvDtype dtype : kAllKvDtypes) {
    for (int head_dim : {2, 6, 8, 16, 24, 64, 128, 256, 512}) {
      for (int group : {2, 8, 32, 64, 512}) {
        if (head_dim % std::min(group, head_dim) != 0) continue;
        const bool int4 = dtype == KvDtype::kInt4 || dtype == KvDtype::kK8V4;
        if (!int4 && group != 64) continue;  // the group only matters for int4
        for (bool v_part : {false, true}) {
          const KvPartLayout part = PartOf(dtype, v_part, head_dim, group);
          INFO(KvDtypeName(dtype) << " head_dim " << head_dim << " group " << part.group_size
                                  << (v_part ? " V" : " K"));
          for (const std::vector<float>& x : TestRows(head_dim, &rng)) {
            std::vector<uint8_t> data(part.row_bytes, 0xa5), meta(part.meta_bytes + 1, 0xa5);
            std::vector<float> scratch(head_dim, NAN);
            EncodeRow(SerialTeam{}, part, head_dim, x.data(), scratch.data(), data.data(),
                      meta.data());
            for (cpu::CpuIsa isa : isas) {
              INFO("cpu path " << cpu::CpuIsaName(isa) << " first value " << x[0]);
              std::vector<uint8_t> want_data(part.row_bytes, 0xa5),
                  want_meta(part.meta_bytes + 1, 0xa5);
              cpu::QuantizeRow(part, head_dim, x.data(), want_data.data(), want_meta.data(), isa);
              REQUIRE(data == want_data);
              REQUIRE(meta == want_meta);  // the extra byte stays untouched
            }
            ++rows_checked;
          }
        }
      }
    }
  }
  REQUIRE(rows_checked > 5000);
}

TEST_CASE("EncodeRow handles NaN rows as the scalar CPU path does", "[kernels][kv_encode]") {
  for (KvDtype dtype : kAllKvDtypes) {
    const KvPartLayout part = PartOf(dtype, false, 16, 8);
    std::vector<float> x(16);
    for (int i = 0; i < 16; ++i) x[i] = 0.25f * (i - 7);
    for (int nan_at : {0, 5, 15}) {
      std::vector<float> y = x;
      y[nan_at] = NAN;
      std::vector<uint8_t> data(part.row_bytes), meta(part.meta_bytes + 1, 0);
      std::vector<uint8_t> want_data(part.row_bytes), want_meta(part.meta_bytes + 1, 0);
      std::vector<float> scratch(16);
      EncodeRow(SerialTeam{}, part, 16, y.data(), scratch.data(), data.data(), meta.data());
      cpu::QuantizeRow(part, 16, y.data(), want_data.data(), want_meta.data(),
                       cpu::CpuIsa::kScalar);
      INFO(KvDtypeName(dtype) << " NaN at " << nan_at);
      REQUIRE(data == want_data);
      REQUIRE(meta == want_meta);
    }
  }
}

}  // namespace
}  // namespace kvserve::cuda::kv_encode
