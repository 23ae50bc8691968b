// int4_kc: the page layout KvFormat builds, the per-channel K encoder
// (round trips within the analytic bound of each channel, whatever the other
// channels' magnitudes), its byte format as cache/format/kv_layout.h documents it,
// and the AVX2 encoder against the scalar one.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/format/kv_format.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv_quant.h"

namespace kvserve::cpu {
namespace {

KvFormat Int4Kc(int hkv, int hd, int bs, int group = 64) {
  absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kInt4Kc, hkv, hd, bs, group);
  REQUIRE(f.ok());
  return *f;
}

// One head's block: rows[j][d].
using Block = std::vector<std::vector<float>>;

struct Encoded {
  std::vector<uint8_t> codes, meta;
};

Encoded Encode(const KvPartLayout& part, int hd, const Block& x, CpuIsa isa) {
  std::vector<const float*> rows;
  for (const auto& r : x) rows.push_back(r.data());
  Encoded e;
  e.codes.assign(static_cast<size_t>(part.row_bytes) * x.size(), 0xcd);
  e.meta.assign(part.meta_bytes, 0xcd);
  QuantizeBlockKChannel(part, hd, static_cast<int>(x.size()), rows.data(), e.codes.data(),
                        e.meta.data(), isa);
  return e;
}

// Channel d of row j as kv_layout.h defines the decoding, from the bytes.
float DocDecode(const Encoded& e, int hd, int j, int d) {
  float lo, unit;
  std::memcpy(&lo, e.meta.data(), 4);
  std::memcpy(&unit, e.meta.data() + 4, 4);
  const int cmin = e.meta[8 + 2 * d], cmax = e.meta[9 + 2 * d];
  const float scale = static_cast<float>(cmax - cmin) * unit;
  const float zero = std::fma(static_cast<float>(15 * cmin), unit, lo);
  const int q = (e.codes[static_cast<size_t>(j) * (hd / 2) + d / 2] >> ((d % 2) * 4)) & 0xf;
  return std::fma(static_cast<float>(q), scale, zero);
}

// Keys as RoPE leaves them: most channels N(0, 1), one pair ~10x larger and
// offset (a slow rotation), one channel constant, one tiny.
Block RopeLikeBlock(int bs, int hd, std::mt19937* rng, float outlier = 10.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Block x(bs, std::vector<float>(hd));
  const float phase = normal(*rng);
  for (int j = 0; j < bs; ++j) {
    for (int d = 0; d < hd; ++d) x[j][d] = normal(*rng);
    x[j][hd - 2] = outlier * std::cos(phase + 0.01f * j) + 0.3f * normal(*rng);
    x[j][hd - 1] = outlier * std::sin(phase + 0.01f * j) + 0.3f * normal(*rng);
    x[j][1] = 2.5f;
    x[j][2] = 1e-3f * normal(*rng);
  }
  return x;
}

TEST_CASE("int4_kc pages: K codes per token, K ranges per channel per block, V as int4",
          "[kernels][kv_quant]") {
  SECTION("stories260K's shape: 4 kv heads of 8, blocks of 16") {
    const KvFormat f = Int4Kc(4, 8, 16);
    REQUIRE(f.dtype() == KvDtype::kInt4Kc);
    REQUIRE(KvDtypeName(f.dtype()) == "int4_kc");
    REQUIRE(f.k().elem == KvElem::kInt4Channel);
    REQUIRE(f.k().row_bytes == 4);
    REQUIRE(f.k().meta_bytes == 8 + 2 * 8);  // lo, unit, (cmin, cmax) x 8
    REQUIRE(f.v().elem == KvElem::kInt4);
    REQUIRE(f.v().group_size == 8);
    REQUIRE(f.v().meta_bytes == 4);
    // K codes 4 x 16 x 4 = 256, K meta 4 x 24 = 96, V codes 256, V meta 256.
    REQUIRE(f.k().data_offset == 0);
    REQUIRE(f.k().meta_offset == 256);
    REQUIRE(f.v().data_offset == 352);
    REQUIRE(f.v().meta_offset == 608);
    REQUIRE(f.block_bytes() == 896);               // 864 rounded up to 64
    REQUIRE(f.bytes_per_token_per_layer() == 54);  // 864 / 16
    REQUIRE(f.layout().BlockMetaOffset(f.k(), 3) == 256 + 3 * 24);
    // fp32 tails: [K rows][V rows] of [4][16][32 bytes].
    REQUIRE(f.has_tails());
    REQUIRE(f.layout().tail.elem == KvElem::kFp32);
    REQUIRE(f.layout().tail.row_bytes == 32);
    REQUIRE(f.layout().tail.v_offset == 2048);
    REQUIRE(f.tail_block_bytes() == 4096);
    REQUIRE(f.layout().TailRowOffset(true, 1, 2) == 2048 + (16 + 2) * 32);
  }
  SECTION("head_dim 128, blocks of 16, fp16 tails as the GPU keeps them") {
    const KvFormat f = *KvFormat::Create(KvDtype::kInt4Kc, 8, 128, 16, 64, KvElem::kFp16);
    // Per head per token: 64 code bytes + (8 + 256) / 16 meta + 64 + 2 x 4 V.
    REQUIRE(f.bytes_per_token_per_layer() == 8 * (64 + 64 + 8) + 8 * 264 / 16);
    REQUIRE(f.block_bytes() == 19520);
    REQUIRE(f.tail_block_bytes() == 2 * 8 * 16 * 256);
    const KvFormat fp16 = *KvFormat::Create(KvDtype::kFp16, 8, 128, 16);
    REQUIRE(static_cast<double>(fp16.block_bytes()) / f.block_bytes() >= 3.35);
  }
  SECTION("blocks under 16 tokens are refused, naming cache.block_size") {
    for (int bs : {1, 8, 15}) {
      absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kInt4Kc, 4, 8, bs);
      REQUIRE(f.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(std::string(f.status().message()).find("cache.block_size") != std::string::npos);
    }
    REQUIRE(KvFormat::Create(KvDtype::kInt4Kc, 4, 8, 16).ok());
    REQUIRE(KvFormat::Create(KvDtype::kInt4, 4, 8, 1).ok());  // other formats do not care
  }
  SECTION("the other formats keep no tails") {
    for (KvDtype d : kAllKvDtypes) {
      REQUIRE_FALSE(KvFormat::Create(d, 4, 8, 16)->has_tails());
      REQUIRE(KvFormat::Create(d, 4, 8, 16)->tail_block_bytes() == 0);
    }
  }
  SECTION("names") {
    REQUIRE(*ParseKvDtype("int4_kc") == KvDtype::kInt4Kc);
    REQUIRE(*ParseKvDtype("INT4_KC") == KvDtype::kInt4Kc);
    REQUIRE(std::string(ParseKvDtype("int4kc").status().message()).find("int4_kc") !=
            std::string::npos);
  }
}

TEST_CASE("int4_kc K round trips within each channel's analytic bound", "[kernels][kv_quant]") {
  std::mt19937 rng(5);
  for (int bs : {16, 32, 64}) {
    for (int hd : {8, 64, 128}) {
      for (float outlier : {1.0f, 10.0f, 1000.0f}) {
        const KvFormat f = Int4Kc(1, hd, bs);
        const Block x = RopeLikeBlock(bs, hd, &rng, outlier);
        const Encoded e = Encode(f.k(), hd, x, CpuIsa::kScalar);
        float lo, unit;
        std::memcpy(&lo, e.meta.data(), 4);
        std::memcpy(&unit, e.meta.data() + 4, 4);
        std::vector<float> scale(hd), zero(hd), row(hd);
        Int4ChannelAffine(e.meta.data(), hd, scale.data(), zero.data());
        float hmin = x[0][0], hmax = x[0][0];
        for (const auto& r : x) {
          hmin = std::min(hmin, *std::min_element(r.begin(), r.end()));
          hmax = std::max(hmax, *std::max_element(r.begin(), r.end()));
        }
        INFO("bs " << bs << " hd " << hd << " outlier " << outlier);
        REQUIRE(lo == hmin);
        REQUIRE(unit == (hmax - hmin) / 3825.0f);
        for (int d = 0; d < hd; ++d) {
          float mn = x[0][d], mx = x[0][d];
          for (const auto& r : x) {
            mn = std::min(mn, r[d]);
            mx = std::max(mx, r[d]);
          }
          INFO("channel " << d << " in [" << mn << ", " << mx << "], scale " << scale[d]);
          // The levels cover the channel and are at most 2 codes wider.
          const float slack = 1e-6f * std::max(std::fabs(hmin), std::fabs(hmax));
          REQUIRE(zero[d] <= mn);
          REQUIRE(std::fma(15.0f, scale[d], zero[d]) >= mx - slack);
          REQUIRE(scale[d] <= (mx - mn) / 15.0f + 2.0f * unit + slack);
          for (int j = 0; j < bs; ++j) {
            const float got = DocDecode(e, hd, j, d);
            REQUIRE(std::fabs(got - x[j][d]) <= scale[d] / 2 + slack);
          }
        }
        // DequantizeRow reads the same bytes the same way.
        for (int j = 0; j < bs; ++j) {
          DequantizeRow(f.k(), hd, e.codes.data() + j * f.k().row_bytes, e.meta.data(), row.data());
          for (int d = 0; d < hd; ++d) REQUIRE(row[d] == DocDecode(e, hd, j, d));
        }
      }
    }
  }
}

TEST_CASE("per-channel ranges keep small channels beside a 10x channel", "[kernels][kv_quant]") {
  // The reason for int4_kc: with head_dim 8 a per-token int4 group spans the
  // whole head, so the 10x pair sets the step for every channel.
  std::mt19937 rng(11);
  const int hd = 8, bs = 16;
  const Block x = RopeLikeBlock(bs, hd, &rng, 10.0f);
  const KvFormat kc = Int4Kc(1, hd, bs);
  const Encoded e = Encode(kc.k(), hd, x, CpuIsa::kScalar);
  const KvFormat int4 = *KvFormat::Create(KvDtype::kInt4, 1, hd, bs, 64);
  double err_kc = 0, err_int4 = 0;
  std::vector<uint8_t> data(int4.k().row_bytes), meta(int4.k().meta_bytes);
  std::vector<float> back(hd);
  for (int j = 0; j < bs; ++j) {
    QuantizeRow(int4.k(), hd, x[j].data(), data.data(), meta.data());
    DequantizeRow(int4.k(), hd, data.data(), meta.data(), back.data());
    for (int d = 0; d < 6; ++d) {  // the N(0, 1) channels and the small ones
      err_kc += std::fabs(DocDecode(e, hd, j, d) - x[j][d]);
      err_int4 += std::fabs(back[d] - x[j][d]);
    }
  }
  INFO("mean abs error of the small channels: int4_kc " << err_kc / (6 * bs) << ", int4 "
                                                        << err_int4 / (6 * bs));
  REQUIRE(err_kc * 4 < err_int4);
  // The constant and the tiny channel are within half a unit of the head's
  // range (1/3825 of it), not half a level (1/15).
  float unit;
  std::memcpy(&unit, e.meta.data() + 4, 4);
  for (int j = 0; j < bs; ++j) {
    REQUIRE(std::fabs(DocDecode(e, hd, j, 1) - 2.5f) <= unit * 0.501f);
    REQUIRE(std::fabs(DocDecode(e, hd, j, 2) - x[j][2]) <= unit * 0.501f + 1e-3f);
  }
}

TEST_CASE("int4_kc K edge cases", "[kernels][kv_quant]") {
  const int hd = 16, bs = 16;
  const KvFormat f = Int4Kc(1, hd, bs);
  SECTION("an all-zero block decodes to zeros with unit 0") {
    const Encoded e = Encode(f.k(), hd, Block(bs, std::vector<float>(hd, 0.0f)), CpuIsa::kScalar);
    REQUIRE(std::all_of(e.codes.begin(), e.codes.end(), [](uint8_t b) { return b == 0; }));
    REQUIRE(std::all_of(e.meta.begin(), e.meta.end(), [](uint8_t b) { return b == 0; }));
  }
  SECTION("a constant block decodes exactly to its value") {
    const Encoded e = Encode(f.k(), hd, Block(bs, std::vector<float>(hd, -3.3f)), CpuIsa::kScalar);
    for (int j = 0; j < bs; ++j) {
      for (int d = 0; d < hd; ++d) REQUIRE(DocDecode(e, hd, j, d) == -3.3f);
    }
  }
  SECTION("channel 2i is the low nibble of byte i") {
    Block x(bs, std::vector<float>(hd, 0.0f));
    x[0][0] = 15.0f;  // row 0: channel 0 at the top of the head range
    x[0][3] = 15.0f;
    const Encoded e = Encode(f.k(), hd, x, CpuIsa::kScalar);
    REQUIRE(e.codes[0] == 0x0f);
    REQUIRE(e.codes[1] == 0xf0);
    REQUIRE(e.codes[hd / 2] == 0x00);  // row 1 is all zeros, the bottom of each range
  }
}

TEST_CASE("AVX2 and scalar int4_kc encoders write identical bytes", "[kernels][kv_quant]") {
  if (!CpuHasAvx2()) {
    WARN("no AVX2 on this CPU: only the scalar path exists");
    return;
  }
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bs : {16, 32, 64}) {
    for (int hd : {8, 64, 128}) {
      const KvFormat f = Int4Kc(1, hd, bs);
      std::vector<Block> blocks;
      for (float outlier : {1.0f, 10.0f, 1e4f})
        blocks.push_back(RopeLikeBlock(bs, hd, &rng, outlier));
      Block ties(bs, std::vector<float>(hd));
      for (int j = 0; j < bs; ++j) {
        for (int d = 0; d < hd; ++d) ties[j][d] = static_cast<float>((j * 7 + d * 3) % 31) / 2.0f;
      }
      blocks.push_back(ties);
      blocks.push_back(Block(bs, std::vector<float>(hd, 0.25f)));
      Block tiny(bs, std::vector<float>(hd));
      for (auto& r : tiny) {
        for (float& v : r) v = std::ldexp(normal(rng), -30);
      }
      blocks.push_back(tiny);
      for (const Block& x : blocks) {
        const Encoded a = Encode(f.k(), hd, x, CpuIsa::kScalar);
        const Encoded b = Encode(f.k(), hd, x, CpuIsa::kAvx2);
        REQUIRE(a.codes == b.codes);
        REQUIRE(a.meta == b.meta);
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
