// `kvserve plan` through the built binary: sizes need their unit, and the
// exit status says whether anything fits.
#include <catch2/catch.hpp>
#include <string>

#include "model/loader/dummy_model.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

int RunPlan(const std::string& args, std::string* out) {
  return testing::RunShell(
      testing::ShellQuote(testing::KvserveBinary()) + " plan " + args + " 2>&1", out);
}

TEST_CASE("kvserve plan: sizes need a unit, and the exit status says whether anything fits",
          "[integration]") {
  std::string out;
  SECTION("a size without a unit is a usage error naming the flag") {
    REQUIRE(RunPlan("--model llama-3-8b --memory 80 --context 4096", &out) == 2);
    REQUIRE(out.find("--memory: '80' has no unit") != std::string::npos);
  }
  SECTION("80GiB and 80GB are different budgets") {
    REQUIRE(RunPlan("--model llama-3-8b --memory 80GiB --context 4096", &out) == 0);
    REQUIRE(out.find("memory 80.00 GiB (85.90 GB)") != std::string::npos);
    out.clear();
    REQUIRE(RunPlan("--model llama-3-8b --memory 80GB --context 4096", &out) == 0);
    REQUIRE(out.find("memory 74.51 GiB (80.00 GB)") != std::string::npos);
  }
  SECTION("--cross-layer: the shared pages' bytes, int4_kc and int2_kc rows left out") {
    REQUIRE(RunPlan("--model llama-3-8b --memory 80GiB --context 4096 --cross-layer 16", &out) ==
            0);
    INFO(out);
    REQUIRE(out.find("cross-layer KV sharing from layer 16: pairs (16, 17), ... share one "
                     "direction per token, 2 of 16 slots a block kept unmerged (retain 0.125)") !=
            std::string::npos);
    // fp16: 24 plain layers of 4,096 bytes a token and 8 shared pages of
    // 548 (2 x 8 x 256 x 2 retained row bytes + 16 x 8 x 4 ratio bytes + 16
    // index bytes a block, 8,720 padded to 8,768).
    REQUIRE(out.find("fp16           102,688    1.28x") != std::string::npos);
    REQUIRE(out.find("int4_kc ") == std::string::npos);
    REQUIRE(out.find("fp16: 128 fp32 tail blocks") != std::string::npos);
  }
  SECTION("int4_kc and per-layer lists: tails reserved, 3.3x fp16's tokens at head_dim 128") {
    REQUIRE(RunPlan("--model llama-3-8b --memory 80GiB --context 4096 --kv-dtype "
                    "int8,int4_kc*,int8 --max-seqs 64",
                    &out) == 0);
    INFO(out);
    REQUIRE(out.find("int4_kc                  39,040    3.36x") != std::string::npos);
    REQUIRE(out.find("int8,int4_kc*,int8       40,824    3.21x") != std::string::npos);
    // int2_kc: 2-bit codes, the same meta and tails (8 x (32 + 16.5 + 32 + 8) B a layer).
    REQUIRE(out.find("int2_kc                  22,656    5.79x") != std::string::npos);
    REQUIRE(out.find("int2_kc: 128 fp16 tail blocks (2 x --max-seqs 64 running sequences) take "
                     "256.00 MiB (268.44 MB) of the budget; it holds 5.76x the tokens of fp16") !=
            std::string::npos);
    REQUIRE(out.find("int4_kc: 128 fp16 tail blocks (2 x --max-seqs 64 running sequences) take "
                     "256.00 MiB (268.44 MB) of the budget; it holds 3.34x the tokens of fp16") !=
            std::string::npos);
    out.clear();
    REQUIRE(RunPlan("--model llama-3-8b --memory 80GiB --context 4096 --kv-dtype int8*3", &out) ==
            2);
    REQUIRE(out.find("'int8*3' names 3 layers but the model has 32") != std::string::npos);
  }
  SECTION("tiers: whole block values per tier and format, the disk in 4 KiB slots") {
    REQUIRE(RunPlan("--model stories110m-shape --memory 4GiB --context 1024 --host-tier 1GiB "
                    "--disk-tier 10GiB",
                    &out) == 0);
    INFO(out);
    REQUIRE(out.find("a 132-byte header and token ids") != std::string::npos);
    // fp16: 12 layers x 16 tokens x 12 kv heads x 64 x 2 x 2 bytes = 589,824
    // bytes a block + 132: 1,820 values in 1 GiB; the disk's slots are
    // 593,920 + 24 bytes: 18,078 in 10 GiB.
    REQUIRE(out.find("fp16                            29,120                      289,248") !=
            std::string::npos);
    REQUIRE(out.find("int8                            54,800                      544,672") !=
            std::string::npos);
  }
  SECTION("fp8_e4m3 weights: the CUDA runner's bytes") {
    // Linear layers 1 byte a weight (32 x 218,103,808) with a 4-byte scale a
    // row (32 x 43,008), the 128k head too (auto: fp8 above 32768 tokens),
    // the embeddings and norms in bf16: 8,561,882,112 bytes.
    REQUIRE(RunPlan("--model llama-3-8b --memory 80GiB --context 4096 --weight-dtype fp8_e4m3",
                    &out) == 0);
    INFO(out);
    REQUIRE(out.find("weights 7.97 GiB (8.56 GB) (fp8_e4m3)") != std::string::npos);
  }
  SECTION("--help names every preset") {
    REQUIRE(RunPlan("--help", &out) == 0);
    for (const std::string& preset : DummyPresetNames()) {
      INFO(preset);
      REQUIRE(out.find(preset) != std::string::npos);
    }
  }
  SECTION("nothing fits: exit 3 with the reason") {
    REQUIRE(RunPlan("--model llama-2-70b --memory 100GiB --context 4096", &out) == 3);
    REQUIRE(out.find("the weights alone exceed --memory") != std::string::npos);
    REQUIRE(out.find("not one sequence of 4096 tokens fits in any KV format") != std::string::npos);
  }
}

// The model flags are one parser for every command (server/cli/flags.h):
// plan takes --tokenizer for a llama2.c checkpoint as generate does, and the
// same bad value gets the same message from each command.
TEST_CASE("kvserve commands share the model flags and their messages", "[integration]") {
  const std::string ckpt = testing::ShellQuote(testing::Stories260kCheckpoint());
  const std::string tok = testing::ShellQuote(testing::Stories260kTokenizer());
  std::string out;
  REQUIRE(RunPlan("--model " + ckpt + " --tokenizer " + tok + " --memory 1GiB --context 256",
                  &out) == 0);
  INFO(out);
  REQUIRE(out.find(": 5 layers, 8 heads / 4 kv heads, head_dim 8") != std::string::npos);
  for (const char* command : {"plan", "generate", "eval-kv"}) {
    INFO(command);
    out.clear();
    const std::string bin = testing::ShellQuote(testing::KvserveBinary());
    REQUIRE(testing::RunShell(bin + " " + command + " --model " + ckpt +
                                  " --block-size 0 --memory 1GiB --context 8 --text x 2>&1",
                              &out) == 2);
    REQUIRE(out.find("--block-size: '0' is not an integer in [1, 65536]") != std::string::npos);
  }
  out.clear();
  REQUIRE(testing::RunShell(testing::ShellQuote(testing::KvserveBinary()) + " serve --help 2>&1",
                            &out) == 0);
  REQUIRE(out.find("k8v4, int4_kc or int2_kc, or one per layer") != std::string::npos);
}

}  // namespace
}  // namespace kvserve
