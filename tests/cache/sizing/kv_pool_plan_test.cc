#include "cache/sizing/kv_pool_plan.h"

#include <catch2/catch.hpp>
#include <string>

#include "cache/format/kv_format.h"

namespace kvserve {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Llama-3-8B with int8 pages of 16 tokens: the bytes of one block id.
int64_t Llama3Int8BlockBytes() {
  absl::StatusOr<KvFormat> f = KvFormat::Create(KvDtype::kInt8, 8, 128, 16);
  REQUIRE(f.ok());
  return f->block_bytes() * 32;
}

KvPoolRequest Cuda(int64_t available) {
  KvPoolRequest r;
  r.default_fraction = 0.9;
  r.available_bytes = available;
  r.reserve_bytes = 1 * kGiB;
  r.enforce_available = true;
  r.weight_bytes = 16 * kGiB;
  r.activation_bytes = 2 * kGiB;
  r.bytes_per_block = Llama3Int8BlockBytes();
  r.block_size = 16;
  r.max_model_len = 8192;
  r.max_num_seqs = 256;
  return r;
}

TEST_CASE("KV pool: memory_fraction of what is left after weights and activations", "[model]") {
  // 32 layers x (K 16384 + K scales 512 + V 16384 + V scales 512) bytes.
  REQUIRE(Llama3Int8BlockBytes() == 1081344);
  KvPoolRequest r = Cuda(120 * kGiB);
  SECTION("the default fraction when none is set") {
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.ok());
    // floor(0.9 * 119 GiB) = 114997749350 bytes / 1081344 = 106347 blocks.
    REQUIRE(p->budget_bytes == 114997749350);
    REQUIRE(p->num_blocks == 106347);
    REQUIRE(p->num_tokens == 106347 * 16);
    REQUIRE(p->pool_bytes == int64_t{106347} * 1081344);
    REQUIRE(p->sized_from == "default");
    REQUIRE(DescribeKvPool(r, *p) ==
            "KV pool: 106347 blocks x 1.03 MiB = 107.10 GiB, 1701552 tokens (default 0.9 of "
            "120.00 GiB left after 16.00 GiB of weights and 2.00 GiB of activations)");
  }
  SECTION("an explicit fraction") {
    r.memory_fraction = 0.5;
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.ok());
    REQUIRE(p->num_blocks == static_cast<int32_t>((119 * kGiB / 2) / 1081344));
    REQUIRE(p->sized_from == "cache.memory_fraction");
  }
  SECTION("num_blocks wins, and must fit what is left") {
    r.memory_fraction = 0.5;
    r.memory_bytes = 10 * kGiB;
    r.num_blocks = 1000;
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.ok());
    REQUIRE(p->num_blocks == 1000);
    REQUIRE(p->sized_from == "cache.num_blocks");
    r.num_blocks = 200000;  // 201 GiB
    p = PlanKvPool(r);
    REQUIRE(p.status().code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(std::string(p.status().message()) ==
            "cache.num_blocks: a pool of 200000 blocks needs 201.42 GiB but only 119.00 GiB are "
            "left after 16.00 GiB of weights, 2.00 GiB of activations and 1.00 GiB reserved");
  }
  SECTION("memory_bytes next") {
    r.memory_bytes = 10 * kGiB;
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.ok());
    REQUIRE(p->num_blocks == 10 * kGiB / 1081344);
    REQUIRE(p->sized_from == "cache.memory_bytes");
  }
  SECTION("a pool that cannot hold one max_model_len sequence names the setting") {
    r = Cuda(2 * kGiB);  // 0.9 GiB of pool: 893 blocks, 8192 tokens need 512: fits
    REQUIRE(PlanKvPool(r).ok());
    r.max_model_len = 32768;  // needs 2048 blocks
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.status().code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(std::string(p.status().message())
                .starts_with("cache.memory_fraction: the KV pool holds 893 blocks"));
    REQUIRE(std::string(p.status().message()).find("needs 2048") != std::string::npos);
  }
  SECTION("nothing left at all") {
    r = Cuda(kGiB / 2);  // less than the reserve
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.status().code() == absl::StatusCode::kResourceExhausted);
  }
}

TEST_CASE("KV pool on the CPU: the default budget unless a key is set", "[model]") {
  KvPoolRequest r;
  r.default_bytes = 4 * kGiB;
  r.bytes_per_block = 1 << 20;
  r.block_size = 16;
  r.max_model_len = 512;  // 32 blocks
  r.max_num_seqs = 64;
  SECTION("max_num_seqs full sequences when they fit the default budget") {
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.ok());
    REQUIRE(p->num_blocks == 64 * 32);
    REQUIRE(p->sized_from == "default");
  }
  SECTION("capped by the default budget, never below one sequence") {
    r.max_num_seqs = 1000;
    REQUIRE(PlanKvPool(r)->num_blocks == 4096);
    r.default_bytes = 1 << 20;
    REQUIRE(PlanKvPool(r)->num_blocks == 32);
  }
  SECTION("an explicit fraction of what the host has available") {
    r.memory_fraction = 0.25;
    r.available_bytes = 8 * kGiB;
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
    REQUIRE(p.ok());
    REQUIRE(p->num_blocks == 2048);
    REQUIRE(p->sized_from == "cache.memory_fraction");
  }
  SECTION("explicit pools are not checked against the host without enforce_available") {
    r.num_blocks = 1 << 20;
    REQUIRE(PlanKvPool(r)->num_blocks == 1 << 20);
  }
  SECTION("bad inputs name the key") {
    r.num_blocks = -1;
    REQUIRE(std::string(PlanKvPool(r).status().message()) ==
            "cache.num_blocks: must be >= 0, got -1");
    r.num_blocks = 0;
    r.memory_fraction = 1.5;
    REQUIRE(std::string(PlanKvPool(r).status().message()) ==
            "cache.memory_fraction: must be in (0, 1], got 1.5");
  }
}

}  // namespace
}  // namespace kvserve
