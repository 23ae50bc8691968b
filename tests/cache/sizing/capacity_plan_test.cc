#include "cache/sizing/capacity_plan.h"

#include <catch2/catch.hpp>
#include <map>

namespace kvserve {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Llama-2-70B: 80 layers, 8 kv heads of head_dim 128.
CapacityPlanRequest Llama2_70b() {
  CapacityPlanRequest r;
  r.num_layers = 80;
  r.num_kv_heads = 8;
  r.head_dim = 128;
  r.context_tokens = 4096;
  r.block_size = 16;
  r.int4_group_size = 64;
  r.batch = 32;
  return r;
}

std::map<KvDtype, KvFormatCapacity> ByDtype(const std::vector<KvFormatCapacity>& plan) {
  std::map<KvDtype, KvFormatCapacity> m;
  for (const KvFormatCapacity& c : plan) m[c.dtype] = c;
  return m;
}

TEST_CASE("Llama-2-70B at 4096 tokens x 32 sequences needs 40 GiB of fp16 KV", "[model]") {
  CapacityPlanRequest req = Llama2_70b();
  req.memory_bytes = 80 * kGiB;  // weights 0: the whole 80 GiB is KV budget
  const auto plan = ByDtype(*PlanCapacity(req));
  const KvFormatCapacity& fp16 = plan.at(KvDtype::kFp16);

  SECTION("320 KiB per token: 80 layers x (K + V) x 8 heads x 128 x 2 bytes") {
    REQUIRE(fp16.bytes_per_token == 80 * 2 * 8 * 128 * 2);
    REQUIRE(fp16.bytes_per_token == 327680);
    REQUIRE(plan.at(KvDtype::kBf16).bytes_per_token == 327680);
    REQUIRE(plan.at(KvDtype::kFp32).bytes_per_token == 655360);
  }
  SECTION("32 x 4096 tokens = 131,072 tokens = 42,949,672,960 bytes (42.9 GB, 40 GiB)") {
    REQUIRE(fp16.blocks_per_seq == 256);
    REQUIRE(fp16.batch_bytes == int64_t{131072} * 327680);
    REQUIRE(fp16.batch_bytes == 42949672960);
    REQUIRE(fp16.batch_bytes == 40 * kGiB);
    REQUIRE(fp16.batch_fits);
  }
  SECTION("scales are counted: int8 and fp8 add 4 bytes per row, int4 g64 8 bytes") {
    // (128 + 4) per part per head
    REQUIRE(plan.at(KvDtype::kInt8).bytes_per_token == 80 * 8 * 2 * (128 + 4));
    REQUIRE(plan.at(KvDtype::kFp8E4m3).bytes_per_token == 80 * 8 * 2 * (128 + 4));
    // 64 bytes of nibbles + 2 groups x (fp16 scale + fp16 zero)
    REQUIRE(plan.at(KvDtype::kInt4).bytes_per_token == 80 * 8 * 2 * (64 + 8));
    // K int8 + V int4
    REQUIRE(plan.at(KvDtype::kK8V4).bytes_per_token == 80 * 8 * ((128 + 4) + (64 + 8)));
  }
  SECTION("the same bytes hold >= 1.9x the tokens in int8/fp8 and >= 3.5x in int4") {
    const double fp16_tokens = static_cast<double>(fp16.num_tokens);
    REQUIRE(fp16.num_tokens == 80 * kGiB / 327680);
    REQUIRE(plan.at(KvDtype::kInt8).num_tokens / fp16_tokens >= 1.9);
    REQUIRE(plan.at(KvDtype::kFp8E4m3).num_tokens / fp16_tokens >= 1.9);
    REQUIRE(plan.at(KvDtype::kInt4).num_tokens / fp16_tokens >= 3.5);
    REQUIRE(plan.at(KvDtype::kInt8).tokens_vs_fp16 == Approx(256.0 / 132.0));
    REQUIRE(plan.at(KvDtype::kInt4).tokens_vs_fp16 == Approx(256.0 / 72.0));
  }
  SECTION("sequences at the context: whole blocks per sequence") {
    REQUIRE(fp16.max_seqs == fp16.num_blocks / 256);
    REQUIRE(fp16.max_seqs == 64);  // 80 GiB / 40 GiB per 32 sequences
  }
}

TEST_CASE("low-rank latents: the plan counts their narrower pages, without int4_kc", "[model]") {
  CapacityPlanRequest req = Llama2_70b();
  req.memory_bytes = 80 * kGiB;
  // One group of the 8 kv heads per layer, 512 values (half the kv width
  // of 1024) in each of a page's K and V rows.
  req.layer_dims.assign(80, KvLayerDims{1, 512});
  req.dtypes = {KvDtype::kFp16, KvDtype::kInt8, KvDtype::kInt4Kc};
  const auto plan = ByDtype(*PlanCapacity(req));
  REQUIRE(plan.size() == 2);
  REQUIRE(plan.at(KvDtype::kFp16).bytes_per_token == 80 * 2 * 512 * 2);
  // int8: one fp32 scale per row of the group, not per head.
  REQUIRE(plan.at(KvDtype::kInt8).bytes_per_token == 80 * 2 * (512 + 4));
}

TEST_CASE("the weights come off the budget first", "[model]") {
  CapacityPlanRequest req = Llama2_70b();
  req.memory_bytes = 80 * kGiB;
  SECTION("what is left is split into whole blocks") {
    req.weight_bytes = 40 * kGiB;
    const auto plan = ByDtype(*PlanCapacity(req));
    const KvFormatCapacity& fp16 = plan.at(KvDtype::kFp16);
    REQUIRE(fp16.kv_budget_bytes == 40 * kGiB);
    REQUIRE(fp16.block_bytes == 16 * 327680);
    REQUIRE(fp16.num_blocks == 40 * kGiB / (16 * 327680));
    REQUIRE(fp16.max_seqs == 32);
    REQUIRE(fp16.batch_fits);
    req.batch = 33;
    REQUIRE_FALSE(ByDtype(*PlanCapacity(req)).at(KvDtype::kFp16).batch_fits);
  }
  SECTION("weights larger than memory leave nothing, not a negative budget") {
    req.weight_bytes = 138 * kGiB;
    const absl::StatusOr<std::vector<KvFormatCapacity>> plan = PlanCapacity(req);
    REQUIRE(plan.ok());
    for (const KvFormatCapacity& c : *plan) {
      REQUIRE(c.kv_budget_bytes == 0);
      REQUIRE(c.num_tokens == 0);
      REQUIRE(c.max_seqs == 0);
      REQUIRE_FALSE(c.batch_fits);
    }
  }
}

TEST_CASE("padded pages: bytes per token are as allocated, padding included", "[model]") {
  // stories260K: 5 layers, 4 kv heads, head_dim 8; int8 regions are 16-byte
  // aligned and blocks 64-byte aligned.
  CapacityPlanRequest req;
  req.num_layers = 5;
  req.num_kv_heads = 4;
  req.head_dim = 8;
  req.context_tokens = 512;
  req.block_size = 1;
  req.memory_bytes = 1 << 20;
  const auto plan = ByDtype(*PlanCapacity(req));
  const KvFormatCapacity& int8 = plan.at(KvDtype::kInt8);
  // One slot per block: K data 32, K meta 16, V data 32, V meta 16 -> 96 -> 128
  // (the unpadded 5 x 4 x 2 x (8 + 4) = 480 bytes a token would understate it).
  REQUIRE(int8.block_bytes == 5 * 128);
  REQUIRE(int8.bytes_per_token == 5 * 128);
  REQUIRE(int8.num_tokens == (1 << 20) / 640);
  SECTION("int4_kc at block 16: 896 bytes a layer, what the daemon allocates") {
    req.block_size = 16;
    const auto kc = ByDtype(*PlanCapacity(req)).at(KvDtype::kInt4Kc);
    REQUIRE(kc.block_bytes == 5 * 896);
    REQUIRE(kc.bytes_per_token == 5 * 56);
  }
}

TEST_CASE("int4_kc at head_dim 128, block 16 holds >= 3.3x the tokens of fp16, tails included",
          "[model]") {
  // Llama-3-8B's KV shape: 32 layers, 8 kv heads of 128.
  CapacityPlanRequest req;
  req.num_layers = 32;
  req.num_kv_heads = 8;
  req.head_dim = 128;
  req.context_tokens = 4096;
  req.block_size = 16;
  req.memory_bytes = 64 * kGiB;
  req.max_seqs = 64;  // scheduler.max_num_seqs: 128 fp16 tails reserved
  const auto plan = ByDtype(*PlanCapacity(req));
  const KvFormatCapacity& fp16 = plan.at(KvDtype::kFp16);
  const KvFormatCapacity& kc = plan.at(KvDtype::kInt4Kc);
  // Per layer per head per token: 64 code bytes + (8 + 2 x 128) / 16 K meta
  // + 64 V codes + 2 x 4 V scale/zero = 152.5 bytes.
  REQUIRE(kc.bytes_per_token == 32 * 8 * 1525 / 10);
  REQUIRE(kc.block_bytes == 32 * 19520);
  REQUIRE(kc.num_tail_blocks == 128);
  REQUIRE(kc.tail_bytes == 128 * 32 * (2 * 8 * 16 * 128 * 2));  // 256 MiB
  REQUIRE(kc.num_blocks == (64 * kGiB - kc.tail_bytes) / kc.block_bytes);
  REQUIRE(fp16.num_tail_blocks == 0);
  const double ratio = static_cast<double>(kc.num_tokens) / fp16.num_tokens;
  INFO("int4_kc holds " << ratio << "x the tokens of fp16 (bytes alone: " << kc.tokens_vs_fp16
                        << "x)");
  REQUIRE(ratio >= 3.3);
  REQUIRE(kc.tokens_vs_fp16_in_budget == Approx(ratio));
  REQUIRE(kc.tokens_vs_fp16 == Approx(512.0 / 152.5));
  SECTION("a per-layer mix sums its layers") {
    req.dtypes = {KvDtype::kFp16, *KvDtypeSpec::Parse("int8,int4_kc*,int8")};
    const auto mix = *PlanCapacity(req);
    REQUIRE(mix.size() == 2);
    REQUIRE(mix[1].spec.ToString() == "int8,int4_kc*,int8");
    REQUIRE(mix[1].bytes_per_token ==
            2 * plan.at(KvDtype::kInt8).bytes_per_token / 32 + 30 * kc.bytes_per_token / 32);
    REQUIRE(mix[1].num_tail_blocks == 128);
    REQUIRE(mix[1].tail_bytes == kc.tail_bytes / 32 * 30);  // the int4_kc layers' tails only
  }
  SECTION("blocks under 16 tokens leave int4_kc out, unless asked for") {
    req.block_size = 8;
    const auto small = *PlanCapacity(req);
    REQUIRE(small.size() == 7);
    req.dtypes = {KvDtype::kInt4Kc};
    const auto refused = PlanCapacity(req);
    REQUIRE(std::string(refused.status().message()).find("cache.block_size") != std::string::npos);
  }
}

TEST_CASE("bad plans name the field", "[model]") {
  CapacityPlanRequest req = Llama2_70b();
  req.memory_bytes = kGiB;
  req.context_tokens = 0;
  REQUIRE(PlanCapacity(req).status().message() == "context must be > 0, got 0");
  req = Llama2_70b();
  req.int4_group_size = 48;
  REQUIRE(PlanCapacity(req).status().code() == absl::StatusCode::kInvalidArgument);
  req = Llama2_70b();
  req.memory_bytes = -1;
  REQUIRE(PlanCapacity(req).status().message() == "memory must be >= 0, got -1");
}

}  // namespace
}  // namespace kvserve
