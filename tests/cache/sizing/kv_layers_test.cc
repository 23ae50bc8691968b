#include "cache/sizing/kv_layers.h"

#include <catch2/catch.hpp>
#include <string>

#include "cache/sizing/block_count.h"

namespace kvserve {
namespace {

// stories260K's KV shape: 5 layers, 4 kv heads of 8, 16-token blocks.
KvLayerShape Stories(KvElem tail_elem = KvElem::kFp32) { return {5, 4, 8, 16, 64, tail_elem}; }

TEST_CASE("BlocksForTokens is the ceiling division", "[cache]") {
  STATIC_REQUIRE(BlocksForTokens(0, 16) == 0);
  STATIC_REQUIRE(BlocksForTokens(1, 16) == 1);
  STATIC_REQUIRE(BlocksForTokens(16, 16) == 1);
  STATIC_REQUIRE(BlocksForTokens(17, 16) == 2);
  STATIC_REQUIRE(BlocksForTokens(int64_t{1} << 31, 16) == 1 << 27);
}

TEST_CASE("ResolveKvLayers: bytes as allocated, padding and tails included", "[cache]") {
  SECTION("fp32: 4 heads x 16 slots x 8 channels x 4 bytes x K and V = 4096 per layer") {
    const KvLayers l = *ResolveKvLayers(KvDtype::kFp32, Stories());
    REQUIRE(l.formats.size() == 5);
    REQUIRE(l.bytes_per_block == 5 * 4096);
    REQUIRE(l.bytes_per_token() == 5 * 256);
    REQUIRE_FALSE(l.has_tails());
    REQUIRE(TailBlocksFor(l, 64) == 0);
  }
  SECTION("int4_kc: 864 bytes of a layer's block padded to 896, the plan's figure too") {
    const KvLayers l = *ResolveKvLayers(KvDtype::kInt4Kc, Stories());
    REQUIRE(l.bytes_per_block == 5 * 896);
    REQUIRE(l.bytes_per_token() == 5 * 56);  // not 5 x 54, the unpadded figure
    REQUIRE(l.bytes_per_tail == 5 * 4096);   // fp32 rows, as on the CPU
    REQUIRE(TailBlocksFor(l, 64) == 128);
    REQUIRE(TailBlocksFor(l, 0) == 2);  // one sequence at least
    const KvLayers gpu = *ResolveKvLayers(KvDtype::kInt4Kc, Stories(KvElem::kFp16));
    REQUIRE(gpu.bytes_per_block == l.bytes_per_block);
    REQUIRE(gpu.bytes_per_tail == 5 * 2048);  // fp16 rows, as on CUDA
  }
  SECTION("a per-layer list sums its layers; only int4_kc layers keep tails") {
    const KvLayers l = *ResolveKvLayers(*KvDtypeSpec::Parse("fp32,int4_kc*,fp32"), Stories());
    REQUIRE(l.formats.front().dtype() == KvDtype::kFp32);
    REQUIRE(l.formats[2].dtype() == KvDtype::kInt4Kc);
    REQUIRE(l.bytes_per_block == 2 * 4096 + 3 * 896);
    REQUIRE(l.bytes_per_tail == 3 * 4096);
  }
}

TEST_CASE("ResolveKvLayers: cross-layer pairs, their shared pages and tails", "[cache]") {
  KvCrossLayerSpec cross;
  cross.from_layer = 2;
  SECTION("fp32 from layer 2: (2, 3) paired, 4 plain; layer 3's page 784 bytes padded to 832") {
    const KvLayers l = *ResolveKvLayers(KvDtype::kFp32, Stories(), "cache.kv_dtype", {}, cross);
    REQUIRE(l.formats[1].cross_role() == KvCrossRole::kNone);
    REQUIRE(l.formats[2].cross_role() == KvCrossRole::kBase);
    REQUIRE(l.formats[3].cross_role() == KvCrossRole::kShared);
    REQUIRE(l.formats[4].cross_role() == KvCrossRole::kNone);
    // 2 retained rows of 32 bytes x 4 heads, K and V; fp16 ratios 16 x 4 x 4; 16 index bytes.
    REQUIRE(l.formats[3].block_bytes() == 832);
    REQUIRE(l.formats[3].bytes_per_token_per_layer() == 49);  // 784 / 16, rounded up
    REQUIRE(l.bytes_per_block == 4 * 4096 + 832);
    REQUIRE(l.bytes_per_token() == 1076);
    REQUIRE(l.bytes_per_tail == 2 * 4096);  // both layers of the pair, fp32
  }
  SECTION("int8 from layer 0: (0, 1), (2, 3); retain 1 keeps all 16 slots") {
    cross.from_layer = 0;
    cross.retain = 1.0;
    const KvLayers l = *ResolveKvLayers(KvDtype::kInt8, Stories(), "cache.kv_dtype", {}, cross);
    REQUIRE(l.formats[0].cross_role() == KvCrossRole::kBase);
    REQUIRE(l.formats[1].cross_role() == KvCrossRole::kShared);
    REQUIRE(l.formats[1].layout().cross.retain_slots == 16);
    REQUIRE(l.formats[3].cross_role() == KvCrossRole::kShared);
  }
  SECTION("errors name the cache.cross_layer key") {
    const auto msg = [&](KvDtypeSpec spec, KvCrossLayerSpec c) {
      return std::string(
          ResolveKvLayers(spec, Stories(), "cache.kv_dtype", {}, c).status().message());
    };
    cross.from_layer = 4;
    REQUIRE(
        msg(KvDtype::kFp32, cross) ==
        "cache.cross_layer.from_layer: 4 leaves no pair of layers (the model has 5; at most 3)");
    cross.from_layer = 0;
    cross.threshold = 1.5;
    REQUIRE(msg(KvDtype::kFp32, cross) ==
            "cache.cross_layer.threshold: 1.5 is not an angle / pi in [0, 1]");
    cross.threshold = 0.1;
    cross.retain = 0;
    REQUIRE(msg(KvDtype::kFp32, cross) ==
            "cache.cross_layer.retain: 0 is not a fraction in (0, 1]");
    cross.retain = 0.125;
    REQUIRE(msg(KvDtype::kInt4Kc, cross) ==
            "cache.cross_layer: kv_dtype int4_kc keeps per-block K ranges and tails; cross-layer "
            "pages take a per-token kv_dtype");
    REQUIRE(msg(*KvDtypeSpec::Parse("fp32,int2_kc,fp32*3"), cross) ==
            "cache.cross_layer: kv_dtype int2_kc keeps per-block K ranges and tails; cross-layer "
            "pages take a per-token kv_dtype");
  }
  SECTION("ParseKvCrossLayer: L, L:T, L:T:R") {
    const KvCrossLayerSpec a = *ParseKvCrossLayer("2", "--cross-layer");
    REQUIRE(a.from_layer == 2);
    REQUIRE(a.threshold == KvCrossLayerSpec::kDefaultThreshold);
    const KvCrossLayerSpec b = *ParseKvCrossLayer("1:0.2:0.25", "--cross-layer");
    REQUIRE(b.threshold == 0.2);
    REQUIRE(b.retain == 0.25);
    REQUIRE(b.ToString() == "1:0.2:0.25");
    REQUIRE(std::string(ParseKvCrossLayer("x:1", "--cross-layer").status().message()) ==
            "--cross-layer: 'x:1' is not L[:T[:R]] (first merged layer, threshold, retained "
            "fraction)");
  }
}

TEST_CASE("ResolveKvLayers: errors name the setting", "[cache]") {
  const auto msg = [](const absl::StatusOr<KvLayers>& s) {
    return std::string(s.status().message());
  };
  REQUIRE(msg(ResolveKvLayers(*KvDtypeSpec::Parse("int8*4"), Stories()))
              .starts_with("cache.kv_dtype: 'int8*4' names 4 layers but the model has 5"));
  REQUIRE(msg(ResolveKvLayers(*KvDtypeSpec::Parse("int8*4"), Stories(), "--kv-dtype"))
              .starts_with("--kv-dtype: 'int8*4' names 4 layers"));
  KvLayerShape small = Stories();
  small.block_size = 8;
  REQUIRE(msg(ResolveKvLayers(KvDtype::kInt4Kc, small))
              .starts_with("cache.block_size must be at least 16"));
}

}  // namespace
}  // namespace kvserve
