// [gpu] model.weight_dtype fp8_e4m3 on a device, on stories260K (bf16
// activations and KV): the stand-in's checks (tests/cuda_stub/
// cuda_fp8_runner_stub_test.cc) against cuBLASLt's real fp8 kernels:
//   - teacher-forced along the CPU runner's greedy tokens (fp32 weights),
//     logits within 3.0 of the CPU's and the CPU's token picked at least
//     85% of the time (the stand-in measured 2.03 and 119 of 128);
//   - a checkpoint shipped in fp8 gives the logits of the same weights
//     quantized at load, bit for bit (same codes, scales and algorithms).
// The first run on a device also says whether cuBLASLt takes the
// descriptors at all (outer-vector scales with the bias and beta = 1
// epilogues): if not, the runner's creation fails naming the GEMM.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/loader/hf_loader.h"
#include "model/loader/hf_writer.h"
#include "model/runner_factory.h"
#include "scheduler/engine.h"
#include "tests/engine_harness.h"
#include "tests/model/cuda/teacher_forced.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Stories;

RunnerOptions Options(const char* device, const char* weight_dtype) {
  testing::EngineSetup s;
  s.num_blocks = 64;
  s.max_num_seqs = 4;
  s.max_num_batched_tokens = 64;
  RunnerOptions o = testing::RunnerOptionsOf(s);
  o.device = device;
  o.dtype = std::string(device) == "cpu" ? "fp32" : "bf16";
  o.kv_dtype =
      std::string(device) == "cpu" ? KvDtypeSpec(KvDtype::kFp32) : KvDtypeSpec(KvDtype::kBf16);
  o.weight_dtype = weight_dtype;
  return o;
}

std::unique_ptr<ModelRunner> Make(const LlamaWeights& w, const RunnerOptions& o) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(w, o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(*r);
}

// `len` greedy tokens after `prompt` by teacher forcing the runner on its own picks.
std::vector<int32_t> GreedyTokens(ModelRunner& r, const std::vector<int32_t>& prompt, int len) {
  std::vector<int32_t> tokens;
  while (static_cast<int>(tokens.size()) < len) {
    std::vector<int32_t> next = tokens;
    next.push_back(0);  // placeholder: its logits row is the one wanted
    const auto logits = testing::TeacherForced(r, prompt, next, 16);
    const std::vector<float>& last = logits.back();
    tokens.push_back(
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
  }
  return tokens;
}

TEST_CASE("[gpu] fp8_e4m3 weights against the CPU runner's fp32", "[gpu]") {
  const std::unique_ptr<ModelRunner> cpu = Make(Stories().weights, Options("cpu", "auto"));
  const std::unique_ptr<ModelRunner> fp8 = Make(Stories().weights, Options("cuda", "fp8_e4m3"));
  REQUIRE(fp8->memory_info().weight_dtype == "fp8_e4m3+head bf16");
  std::mt19937 rng(29);
  float worst = 0;
  int top1 = 0, steps = 0;
  for (int i = 0; i < 4; ++i) {
    const std::string text = i == 0 ? "" : testing::RandomSnippet(rng, 100);
    const std::vector<int32_t> prompt = Stories().tokenizer->Encode(text, true);
    const std::vector<int32_t> tokens = GreedyTokens(*cpu, prompt, 16);
    const auto want = testing::TeacherForced(*cpu, prompt, tokens, 16);
    const auto got = testing::TeacherForced(*fp8, prompt, tokens, 16);
    for (size_t k = 0; k < tokens.size(); ++k) {
      for (size_t v = 0; v < want[k].size(); ++v) {
        worst = std::max(worst, std::abs(got[k][v] - want[k][v]));
      }
      top1 += std::max_element(got[k].begin(), got[k].end()) - got[k].begin() == tokens[k];
      ++steps;
    }
  }
  WARN("fp8 on the device: max |logit - CPU fp32| " << worst << ", top-1 " << top1 << " of "
                                                    << steps);
  REQUIRE(worst <= 3.0f);
  REQUIRE(top1 >= 0.85 * steps);
}

TEST_CASE("[gpu] a shipped fp8 checkpoint gives the logits of quantizing at load", "[gpu]") {
  const std::string fp8_dir = testing::MakeTempDir("gpu_fp8_shipped");
  const std::string fp32_dir = testing::MakeTempDir("gpu_fp8_source");
  REQUIRE(
      WriteHfFp8Directory(Stories().weights, testing::Stories260kTokenizer(), fp8_dir, {}).ok());
  REQUIRE(WriteHfDirectory(Stories().weights, testing::Stories260kTokenizer(), fp32_dir).ok());
  absl::StatusOr<LlamaWeights> shipped = LoadHfDirectory(fp8_dir);
  absl::StatusOr<LlamaWeights> source = LoadHfDirectory(fp32_dir);
  REQUIRE((shipped.ok() && source.ok()));
  const std::unique_ptr<ModelRunner> at_load = Make(*source, Options("cuda", "fp8_e4m3"));
  const std::unique_ptr<ModelRunner> as_shipped = Make(*shipped, Options("cuda", "auto"));
  std::mt19937 rng(4);
  std::vector<int32_t> prompt(20), tokens(12);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 500) + 3;
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 500) + 3;
  const auto a = testing::TeacherForced(*at_load, prompt, tokens, 8);
  const auto b = testing::TeacherForced(*as_shipped, prompt, tokens, 8);
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("step " << k);
    REQUIRE(std::memcmp(a[k].data(), b[k].data(), a[k].size() * 4) == 0);
  }
}

}  // namespace
}  // namespace kvserve
