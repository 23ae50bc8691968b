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
