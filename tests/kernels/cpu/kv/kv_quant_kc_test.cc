// int4_kc and int2_kc: the page layout KvFormat builds, the per-channel K
// encoder (round trips within the analytic bound of each channel, whatever
// the other channels' magnitudes), its byte format as
// cache/format/kv_layout.h documents it, and the AVX2 encoder against the
// scalar one; every K test runs at 4 and at 2 bits.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/format/kv_format.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {
namespace {

KvFormat Int4Kc(int hkv, int hd, int bs, int group = 64, KvDtype dtype = KvDtype::kInt4Kc) {
  absl::StatusOr<KvFormat> f = KvFormat::Create(dtype, hkv, hd, bs, group);
  REQUIRE(f.ok());
  return *f;
}

constexpr KvDtype kKcDtypes[] = {KvDtype::kInt4Kc, KvDtype::kInt2Kc};

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

// Channel d of row j as kv_layout.h defines the decoding, from the bytes:
// bits 4 (L = 15, two codes a byte) or 2 (L = 3, four codes a byte).
float DocDecode(const Encoded& e, int hd, int j, int d, int bits = 4) {
  float lo, unit;
  std::memcpy(&lo, e.meta.data(), 4);
  std::memcpy(&unit, e.meta.data() + 4, 4);
  const int levels = bits == 4 ? 15 : 3, per = 8 / bits;
  const int cmin = e.meta[8 + 2 * d], cmax = e.meta[9 + 2 * d];
  const float scale = static_cast<float>(cmax - cmin) * unit;
  const float zero = std::fma(static_cast<float>(levels * cmin), unit, lo);
  const int q =
      (e.codes[static_cast<size_t>(j) * (hd / per) + d / per] >> ((d % per) * bits)) & levels;
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
  SECTION("int2_kc at stories260K's shape: 2-bit codes, the same meta") {
    const KvFormat f = Int4Kc(4, 8, 16, 64, KvDtype::kInt2Kc);
    REQUIRE(KvDtypeName(f.dtype()) == "int2_kc");
    REQUIRE(f.k().elem == KvElem::kInt4Channel);
    REQUIRE(f.k().bits == 2);
    REQUIRE(f.v().elem == KvElem::kInt4);
    REQUIRE(f.v().bits == 2);
    REQUIRE(f.k().row_bytes == 2);
    REQUIRE(f.k().meta_bytes == 8 + 2 * 8);
    REQUIRE(f.v().row_bytes == 2);
    REQUIRE(f.v().group_size == 8);
    REQUIRE(f.v().meta_bytes == 4);
    // K codes 4 x 16 x 2 = 128, K meta 96, V codes 128, V meta 256.
    REQUIRE(f.k().meta_offset == 128);
    REQUIRE(f.v().data_offset == 224);
    REQUIRE(f.v().meta_offset == 352);
    REQUIRE(f.block_bytes() == 640);               // 608 rounded up to 64
    REQUIRE(f.bytes_per_token_per_layer() == 38);  // 608 / 16
    REQUIRE(f.tail_block_bytes() == 4096);         // the same fp32 tails as int4_kc
  }
  SECTION("int2_kc at head_dim 128, fp16 tails") {
    const KvFormat f = *KvFormat::Create(KvDtype::kInt2Kc, 8, 128, 16, 64, KvElem::kFp16);
    // Per head per token: 32 code bytes + (8 + 256) / 16 meta + 32 + 2 x 4 V.
    REQUIRE(f.bytes_per_token_per_layer() == 8 * (32 + 32 + 8) + 8 * 264 / 16);
    REQUIRE(f.block_bytes() == 11328);
    REQUIRE(f.tail_block_bytes() == 2 * 8 * 16 * 256);
    const KvFormat fp16 = *KvFormat::Create(KvDtype::kFp16, 8, 128, 16);
    REQUIRE(static_cast<double>(fp16.block_bytes()) / f.block_bytes() >= 5.78);
  }
  SECTION("int2_kc needs four codes a byte: head_dim and V groups multiples of 4") {
    absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kInt2Kc, 4, 6, 16);
    REQUIRE(f.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(f.status().message()).find("head_dim") != std::string::npos);
    f = KvFormat::Create(KvDtype::kInt2Kc, 4, 12, 16, 6);
    REQUIRE(f.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(f.status().message()).find("cache.int4_group_size") != std::string::npos);
    REQUIRE(KvFormat::Create(KvDtype::kInt4Kc, 4, 12, 16, 6).ok());  // int4 packs pairs
  }
  SECTION("blocks under 16 tokens are refused, naming cache.block_size") {
    for (KvDtype d : kKcDtypes) {
      for (int bs : {1, 8, 15}) {
        absl::StatusOr<KvFormat> f = KvFormat::Create(d, 4, 8, bs);
        REQUIRE(f.status().code() == absl::StatusCode::kInvalidArgument);
        REQUIRE(std::string(f.status().message()).find("cache.block_size") != std::string::npos);
        REQUIRE(std::string(f.status().message()).find(KvDtypeName(d)) != std::string::npos);
      }
      REQUIRE(KvFormat::Create(d, 4, 8, 16).ok());
    }
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
    REQUIRE(*ParseKvDtype("int2_kc") == KvDtype::kInt2Kc);
    REQUIRE(std::string(ParseKvDtype("int4kc").status().message()).find("int4_kc") !=
            std::string::npos);
    REQUIRE(std::string(ParseKvDtype("int2").status().message()).find("int2_kc") !=
            std::string::npos);
  }
}

TEST_CASE("int4_kc and int2_kc K round trip within each channel's analytic bound",
          "[kernels][kv_quant]") {
  std::mt19937 rng(5);
  for (KvDtype dtype : kKcDtypes)
    for (int bs : {16, 32, 64}) {
      for (int hd : {8, 64, 128}) {
        for (float outlier : {1.0f, 10.0f, 1000.0f}) {
          const int bits = KcDtypeBits(dtype);
          const float levels = bits == 4 ? 15.0f : 3.0f;
          const KvFormat f = Int4Kc(1, hd, bs, 64, dtype);
          const Block x = RopeLikeBlock(bs, hd, &rng, outlier);
          const Encoded e = Encode(f.k(), hd, x, CpuIsa::kScalar);
          float lo, unit;
          std::memcpy(&lo, e.meta.data(), 4);
          std::memcpy(&unit, e.meta.data() + 4, 4);
          std::vector<float> scale(hd), zero(hd), row(hd);
          Int4ChannelAffine(e.meta.data(), hd, scale.data(), zero.data(), bits);
          float hmin = x[0][0], hmax = x[0][0];
          for (const auto& r : x) {
            hmin = std::min(hmin, *std::min_element(r.begin(), r.end()));
            hmax = std::max(hmax, *std::max_element(r.begin(), r.end()));
          }
          INFO(KvDtypeName(dtype) << " bs " << bs << " hd " << hd << " outlier " << outlier);
          REQUIRE(lo == hmin);
          REQUIRE(unit == (hmax - hmin) / (255.0f * levels));
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
            REQUIRE(std::fma(levels, scale[d], zero[d]) >= mx - slack);
            REQUIRE(scale[d] <= (mx - mn) / levels + 2.0f * unit + slack);
            for (int j = 0; j < bs; ++j) {
              const float got = DocDecode(e, hd, j, d, bits);
              REQUIRE(std::fabs(got - x[j][d]) <= scale[d] / 2 + slack);
            }
          }
          // DequantizeRow reads the same bytes the same way.
          for (int j = 0; j < bs; ++j) {
            DequantizeRow(f.k(), hd, e.codes.data() + j * f.k().row_bytes, e.meta.data(),
                          row.data());
            for (int d = 0; d < hd; ++d) REQUIRE(row[d] == DocDecode(e, hd, j, d, bits));
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

TEST_CASE("int4_kc and int2_kc K edge cases", "[kernels][kv_quant]") {
  const int hd = 16, bs = 16;
  const KvDtype dtype = GENERATE(KvDtype::kInt4Kc, KvDtype::kInt2Kc);
  const int bits = KcDtypeBits(dtype);
  const KvFormat f = Int4Kc(1, hd, bs, 64, dtype);
  INFO(KvDtypeName(dtype));
  SECTION("an all-zero block decodes to zeros with unit 0") {
    const Encoded e = Encode(f.k(), hd, Block(bs, std::vector<float>(hd, 0.0f)), CpuIsa::kScalar);
    REQUIRE(std::all_of(e.codes.begin(), e.codes.end(), [](uint8_t b) { return b == 0; }));
    REQUIRE(std::all_of(e.meta.begin(), e.meta.end(), [](uint8_t b) { return b == 0; }));
  }
  SECTION("a constant block decodes exactly to its value") {
    const Encoded e = Encode(f.k(), hd, Block(bs, std::vector<float>(hd, -3.3f)), CpuIsa::kScalar);
    for (int j = 0; j < bs; ++j) {
      for (int d = 0; d < hd; ++d) REQUIRE(DocDecode(e, hd, j, d, bits) == -3.3f);
    }
  }
  SECTION("int2_kc: channel 4i + k is in bits 2k, 2k + 1 of byte i") {
    if (bits != 2) return;
    Block x(bs, std::vector<float>(hd, 0.0f));
    x[0][0] = 3.0f;  // row 0: channels 0 and 5 at the top of the head range
    x[0][5] = 3.0f;
    x[1][6] = 1.0f;  // channel 6 over [0, 3]: code 1 in row 1, 3 in row 2
    x[2][6] = 3.0f;
    const Encoded e = Encode(f.k(), hd, x, CpuIsa::kScalar);
    REQUIRE(e.codes[0] == 0x03);
    REQUIRE(e.codes[1] == 0x0c);
    REQUIRE(e.codes[hd / 4 + 1] == 0x10);
    REQUIRE(e.codes[2 * (hd / 4) + 1] == 0x30);
    // The range [0, 3] is 255 codes of 3 units: decoded within fp32 rounding.
    REQUIRE(std::fabs(DocDecode(e, hd, 1, 6, bits) - 1.0f) <= 1e-6f);
    REQUIRE(std::fabs(DocDecode(e, hd, 0, 5, bits) - 3.0f) <= 3e-6f);
  }
  SECTION("channel 2i is the low nibble of byte i") {
    if (bits != 4) return;
    Block x(bs, std::vector<float>(hd, 0.0f));
    x[0][0] = 15.0f;  // row 0: channel 0 at the top of the head range
    x[0][3] = 15.0f;
    const Encoded e = Encode(f.k(), hd, x, CpuIsa::kScalar);
    REQUIRE(e.codes[0] == 0x0f);
    REQUIRE(e.codes[1] == 0xf0);
    REQUIRE(e.codes[hd / 2] == 0x00);  // row 1 is all zeros, the bottom of each range
  }
}

TEST_CASE("AVX2 and scalar int4_kc and int2_kc encoders write identical bytes",
          "[kernels][kv_quant]") {
  if (!CpuHasAvx2()) {
    WARN("no AVX2 on this CPU: only the scalar path exists");
    return;
  }
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (KvDtype dtype : kKcDtypes)
    for (int bs : {16, 32, 64}) {
      for (int hd : {8, 64, 128}) {
        const KvFormat f = Int4Kc(1, hd, bs, 64, dtype);
        INFO(KvDtypeName(dtype) << " bs " << bs << " hd " << hd);
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

TEST_CASE("int2_kc V rows: 2-bit groups per token round trip within half a level",
          "[kernels][kv_quant]") {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int hd : {8, 64, 128}) {
    for (int group : {8, 32, 64}) {
      const KvFormat f = Int4Kc(1, hd, 16, group, KvDtype::kInt2Kc);
      const KvPartLayout& v = f.v();
      REQUIRE(v.bits == 2);
      REQUIRE(v.group_size == std::min(group, hd));
      REQUIRE(v.row_bytes == hd / 4);
      REQUIRE(v.meta_bytes == 4 * (hd / v.group_size));
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> x(hd), back(hd);
        for (float& a : x) a = normal(rng) * (trial % 2 == 0 ? 1.0f : 30.0f);
        std::vector<uint8_t> data(v.row_bytes, 0xcd), meta(v.meta_bytes, 0xcd);
        std::vector<uint8_t> data2 = data, meta2 = meta;
        QuantizeRow(v, hd, x.data(), data.data(), meta.data(), CpuIsa::kScalar);
        QuantizeRow(v, hd, x.data(), data2.data(), meta2.data(), CpuIsa::kAuto);
        REQUIRE(data == data2);
        REQUIRE(meta == meta2);
        DequantizeRow(v, hd, data.data(), meta.data(), back.data());
        for (int g0 = 0; g0 < hd; g0 += v.group_size) {
          uint16_t pair[2];
          std::memcpy(pair, meta.data() + (g0 / v.group_size) * 4, 4);
          const float scale = Fp16ToFloat(pair[0]), zero = Fp16ToFloat(pair[1]);
          const float mx = *std::max_element(x.begin() + g0, x.begin() + g0 + v.group_size);
          const float mn = *std::min_element(x.begin() + g0, x.begin() + g0 + v.group_size);
          // fp16 scale and zero are within 2^-11 relative of (max - min) / 3
          // and min; a value is then within half a level plus their drift
          // over the 3 levels.
          const float slack = 4 * 0x1p-11f * (std::fabs(mn) + (mx - mn));
          REQUIRE(std::fabs(scale - (mx - mn) / 3.0f) <= slack);
          for (int i = g0; i < g0 + v.group_size; ++i) {
            INFO("hd " << hd << " group " << group << " channel " << i);
            const int q = (data[i / 4] >> ((i % 4) * 2)) & 3;
            REQUIRE(std::fabs(back[i] - (static_cast<float>(q) * scale + zero)) <=
                    1e-6f * (std::fabs(zero) + 3 * scale));
            REQUIRE(std::fabs(back[i] - x[i]) <= scale / 2 + slack);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
