// The runner factory: model.device and model.dtype parsing, the CPU runner's
// pool sizing, and the start-up errors that name the key.
#include "model/runner_factory.h"

#include <catch2/catch.hpp>
#include <string>

#include "model/loader/llama2c_loader.h"
#include "tests/model/stories260k.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Stories260k;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("model.device: cpu, cuda, cuda:N", "[model]") {
  REQUIRE(ParseDevice("cpu")->kind == DeviceSpec::Kind::kCpu);
  REQUIRE(ParseDevice("cuda")->kind == DeviceSpec::Kind::kCuda);
  REQUIRE(ParseDevice("cuda")->ordinal == 0);
  REQUIRE(ParseDevice("cuda:3")->ordinal == 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CPU"}) {
    INFO(bad);
    REQUIRE(Message(ParseDevice(bad).status()) ==
            std::string("model.device: expected cpu, cuda or cuda:N, got '") + bad + "'");
  }
}

TEST_CASE("model.dtype: auto is fp32 on the CPU and bf16 on CUDA", "[model]") {
  const DeviceSpec cpu;
  DeviceSpec cuda;
  cuda.kind = DeviceSpec::Kind::kCuda;
  REQUIRE(*ResolveWeightDtype("auto", cpu) == WeightDtype::kFp32);
  REQUIRE(*ResolveWeightDtype("auto", cuda) == WeightDtype::kBf16);
  REQUIRE(*ResolveWeightDtype("fp16", cuda) == WeightDtype::kFp16);
  REQUIRE(*ResolveWeightDtype("bfloat16", cpu) == WeightDtype::kBf16);
  REQUIRE(Message(ResolveWeightDtype("int8", cpu).status()) ==
          "model.dtype: expected auto, fp32, fp16 or bf16, got 'int8'");
}

TEST_CASE("The CPU runner: pool sized by the plan, fp32 only", "[model]") {
  RunnerOptions o;
  o.kv_dtype = KvDtype::kInt8;
  o.max_num_seqs = 3;
  SECTION("default: max_num_seqs sequences of the model's 512 positions") {
    absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories260k(), o);
    REQUIRE(r.ok());
    REQUIRE((*r)->num_blocks() == 3 * 32);
    const RunnerMemoryInfo& m = (*r)->memory_info();
    REQUIRE(m.device == "cpu");
    REQUIRE(m.weight_dtype == "fp32");
    REQUIRE(m.num_blocks == 96);
    REQUIRE(m.kv_bytes_per_block == (*r)->kv_format().block_bytes() * 5);
    REQUIRE(m.kv_pool_bytes == m.kv_bytes_per_block * 96);
    REQUIRE(m.kv_pool_tokens == 96 * 16);
    REQUIRE(m.pool_sized_from == "default");
  }
  SECTION("cache.num_blocks and max_model_len") {
    o.num_blocks = 40;
    o.max_model_len = 64;
    o.num_swap_blocks = 5;
    absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories260k(), o);
    REQUIRE(r.ok());
    REQUIRE((*r)->num_blocks() == 40);
    REQUIRE((*r)->num_swap_blocks() == 5);
    REQUIRE((*r)->memory_info().pool_sized_from == "cache.num_blocks");
    o.num_blocks = 3;  // 64 tokens need 4 blocks of 16
    REQUIRE(CreateModelRunner(Stories260k(), o).status().code() ==
            absl::StatusCode::kResourceExhausted);
  }
  SECTION("fp16 weights are refused on the CPU, naming model.dtype") {
    o.dtype = "fp16";
    REQUIRE(Message(CreateModelRunner(Stories260k(), o).status()) ==
            "model.dtype: fp16: the CPU backend computes in fp32; use model.dtype: fp32 or auto");
  }
  SECTION("a bad cache shape names the cache") {
    o.block_size = 0;
    REQUIRE(Message(CreateModelRunner(Stories260k(), o).status()).starts_with("cache"));
  }
}

TEST_CASE("The CPU runner with int4_kc: per-layer formats, tails off the budget first", "[model]") {
  RunnerOptions o;
  o.kv_dtype = *KvDtypeSpec::Parse("int8,int4_kc*,int8");
  o.max_num_seqs = 3;
  o.num_swap_blocks = 4;
  SECTION("two tails per running sequence, in the pool and in the swap pool") {
    absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories260k(), o);
    REQUIRE(r.ok());
    REQUIRE((*r)->num_tail_blocks() == 6);
    REQUIRE((*r)->num_swap_tail_blocks() == 6);
    const RunnerMemoryInfo& m = (*r)->memory_info();
    // stories260K, block 16: int8 1536 bytes per layer, int4_kc 896 (K 256 + 96, V 256 + 256).
    REQUIRE(m.kv_bytes_per_block == 2 * 1536 + 3 * 896);
    // 6 fp32 tails x 3 int4_kc layers x 2 x 4 heads x 16 x 8 x 4 bytes, beside the blocks.
    REQUIRE(m.kv_pool_bytes == m.kv_bytes_per_block * m.num_blocks + 6 * 3 * 4096);
  }
  SECTION("cache.memory_bytes pays for the tails before the blocks") {
    o.memory_bytes = 6 * 3 * 4096 + 40 * (2 * 1536 + 3 * 896) + 100;
    absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories260k(), o);
    REQUIRE(r.ok());
    REQUIRE((*r)->num_blocks() == 40);
  }
  SECTION("a list that does not fit the model names cache.kv_dtype") {
    o.kv_dtype = *KvDtypeSpec::Parse("int8*4");
    REQUIRE(Message(CreateModelRunner(Stories260k(), o).status()) ==
            "cache.kv_dtype: 'int8*4' names 4 layers but the model has 5 (NAME* fills the layers "
            "left)");
  }
  SECTION("int4_kc blocks under 16 tokens name cache.block_size") {
    o.kv_dtype = KvDtype::kInt4Kc;
    o.block_size = 8;
    REQUIRE(Message(CreateModelRunner(Stories260k(), o).status())
                .starts_with("cache.block_size must be at least 16"));
  }
}

TEST_CASE("model.device: cuda without a device or without CUDA names the key", "[model]") {
  RunnerOptions o;
  o.device = "cuda:7";
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(Stories260k(), o);
  // make test runs where no CUDA device 7 exists (or the build has no CUDA).
  REQUIRE_FALSE(r.ok());
  INFO(Message(r.status()));
  REQUIRE(Message(r.status()).starts_with("model.device: cuda:7: "));
}

}  // namespace
}  // namespace kvserve
