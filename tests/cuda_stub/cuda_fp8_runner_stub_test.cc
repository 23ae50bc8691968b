// model.weight_dtype fp8_e4m3 on the CUDA runner through the stand-in, on
// stories260K (bf16 activations and KV):
//   - teacher-forced along the CPU runner's greedy tokens (fp32 weights),
//     the fp8 runner's logits stay within kMaxLogitDiff of the CPU's and
//     pick the CPU's token at least kMinTop1 of the time, and within 4 of
//     as often as the CPU runner with the same fp8 weight values in fp32
//     arithmetic (what fp8 weights cost by themselves); the bf16-weight
//     CUDA runner, measured beside it, keeps every token;
//   - free-running, the first greedy token is the CPU's and every token is
//     within kNearTie of the CPU's maximum given the same history (fp8's
//     greedy text parts from fp32's within 1 to 20 tokens on this dim-64
//     model, as fp8 weights in exact arithmetic do);
//   - a checkpoint shipped in fp8 (written here, hf_writer.h) gives the very
//     logits of the same weights quantized at load, bit for bit (same codes
//     and scales, the same kernels).
//
// Why these bounds hold on a device too: the codes and scales are the
// host's (weights) and exact_math's (activations, QuantizeRowsFp8) on
// either; what differs is the fp8 GEMM's summation order (a few fp32 ulps
// of each output), which is far below an e4m3 step (2^-4 relative).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kv/kv_quant.h"
#include "model/loader/dummy_model.h"
#include "model/loader/hf_loader.h"
#include "model/loader/hf_writer.h"
#include "model/loader/quantize_weights.h"
#include "tests/cuda_stub/stub_engine.h"
#include "tests/model/cuda/teacher_forced.h"

namespace kvserve {
namespace {

using testing::Greedy;
using testing::MakeStubEngine;
using testing::RandomSnippet;
using testing::Result;
using testing::RunConcurrently;
using testing::StubEngine;
using testing::StubSetup;

// Measured on this stand-in (seeds fixed below; each case WARNs its
// numbers): logits within 2.03 of the CPU's (fp8 weights in fp32
// arithmetic: 1.23), top-1 119 of 128 (120), free-running greedy tokens
// equal for 20, 1, 1 and 7 of 32, 10 of 128 tokens not the CPU's argmax
// but within 0.5 of it (the largest gap seen is between 0.25 and 0.5).
// The bounds keep a margin over that.
constexpr float kMaxLogitDiff = 3.0f;
constexpr double kMinTop1 = 0.85;
constexpr int kSameTokens = 1;
constexpr float kNearTie = 0.5f;
// Dummy weights quantized from bf16 rows (device) against from fp32 (host),
// relative to the largest logit: measured 0.057 (0.056 of logits up to
// 0.99 on dummy:tiny); weights taken from the wrong stream offsets or rows
// scaled by another row's scale would differ by about the logits' range.
constexpr float kDummyLogitDiff = 0.1f;

StubSetup Fp8Setup(const char* weight_dtype) {
  StubSetup s;
  s.dtype = "bf16";
  s.kv_dtype = "bf16";
  s.weight_dtype = weight_dtype;
  return s;
}

std::vector<GenerateRequest> Requests(int len) {
  std::mt19937 rng(29);
  std::vector<GenerateRequest> reqs;
  reqs.push_back(Greedy("", len));
  for (int i = 0; i < 3; ++i) reqs.push_back(Greedy(RandomSnippet(rng, 100), len));
  for (GenerateRequest& r : reqs) r.ignore_eos = true;
  return reqs;
}

// The CPU runner on stories260K with each linear weight replaced by its
// fp8 value (code x scale) and fp32 arithmetic: fp8 weights alone, without
// the activations' quantization and bf16 rounding of the CUDA path.
std::unique_ptr<ModelRunner> CpuWithFp8Weights(std::vector<std::vector<float>>* storage) {
  LlamaWeights w = testing::Stories().weights;
  storage->reserve(7 * w.layers.size());
  auto dequantize = [&](Tensor& t) {
    const Fp8Matrix m = Fp8Matrix::Quantize(t.data, t.shape[0], t.shape[1]);
    std::vector<float>& v = storage->emplace_back(m.codes.size());
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = cpu::Fp8E4m3ToFloat(m.codes[i]) * m.scales[i / static_cast<size_t>(m.cols)];
    }
    t.data = v.data();
  };
  for (LayerWeights& l : w.layers) {
    for (Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) dequantize(*t);
  }
  StubSetup s;
  s.device = "cpu";
  s.max_num_seqs = 1;
  RunnerOptions o = testing::RunnerOptionsOf(s);
  o.dtype = "fp32";
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(std::move(w), o);
  REQUIRE(r.ok());
  return std::move(*r);
}

TEST_CASE("stub runner: fp8_e4m3 weights against the CPU runner's fp32", "[cuda_stub]") {
  const int len = 32;
  const std::vector<GenerateRequest> reqs = Requests(len);
  StubSetup cpu;
  cpu.device = "cpu";
  StubEngine c = MakeStubEngine(cpu);
  const std::vector<Result> on_cpu = RunConcurrently(*c.engine, reqs);
  StubSetup one = cpu;
  one.max_num_seqs = 1;
  const std::unique_ptr<ModelRunner> ref = testing::MakeStubRunner(one);
  std::vector<std::vector<float>> storage;
  const std::unique_ptr<ModelRunner> weights_only = CpuWithFp8Weights(&storage);

  // Teacher-forced along the CPU's greedy tokens: the largest logit
  // difference from the CPU's and how often the runner's argmax is the
  // CPU's token.
  struct Agreement {
    float worst = 0;
    int top1 = 0, steps = 0;
  };
  auto agreement = [&](ModelRunner& r) {
    Agreement a;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::vector<int32_t> prompt =
          testing::Stories().tokenizer->Encode(reqs[i].prompt, true);
      const std::vector<int32_t>& tokens = on_cpu[i].tokens[0];
      const auto want = testing::TeacherForced(*ref, prompt, tokens, 16);
      const auto got = testing::TeacherForced(r, prompt, tokens, 16);
      for (size_t k = 0; k < tokens.size(); ++k) {
        for (size_t v = 0; v < want[k].size(); ++v) {
          a.worst = std::max(a.worst, std::abs(got[k][v] - want[k][v]));
        }
        a.top1 += std::max_element(got[k].begin(), got[k].end()) - got[k].begin() == tokens[k];
        ++a.steps;
      }
    }
    return a;
  };
  const Agreement ideal = agreement(*weights_only);
  StubSetup g = Fp8Setup("fp8_e4m3");
  g.max_num_seqs = 1;
  const std::unique_ptr<ModelRunner> fp8 = testing::MakeStubRunner(g);
  REQUIRE(fp8->memory_info().weight_dtype == "fp8_e4m3+head bf16");
  const Agreement on_fp8 = agreement(*fp8);
  g.weight_dtype = "auto";
  const std::unique_ptr<ModelRunner> bf16 = testing::MakeStubRunner(g);
  REQUIRE(bf16->memory_info().weight_dtype == "bf16");
  const Agreement on_bf16 = agreement(*bf16);
  WARN("max |logit - CPU fp32| and top-1 agreement of "
       << on_fp8.steps << " steps: fp8 runner " << on_fp8.worst << ", " << on_fp8.top1
       << "; fp8 weights in fp32 arithmetic " << ideal.worst << ", " << ideal.top1
       << "; bf16 runner " << on_bf16.worst << ", " << on_bf16.top1);
  // bf16 weights and activations alone keep every token; fp8 loses what
  // fp8 weights lose in exact arithmetic, give or take the activations'
  // own e4m3 step (measured: 119 against 120 of 128; logits within 2.03
  // against 1.23; bf16 0.26 and 128).
  REQUIRE(on_bf16.top1 == on_bf16.steps);
  REQUIRE(on_bf16.worst <= 0.5f);
  REQUIRE(on_fp8.top1 >= ideal.top1 - 4);
  REQUIRE(on_fp8.top1 >= kMinTop1 * on_fp8.steps);
  REQUIRE(on_fp8.worst <= kMaxLogitDiff);

  // Free-running: fp8 greedy text parts from the CPU's early on this tiny
  // model (dim 64: an e4m3 step of a weight moves a logit visibly), so
  // what holds is that the first token is the CPU's and every token the
  // fp8 runner picks is within kNearTie of the CPU's maximum given the same
  // history (tests/model/cuda/teacher_forced.h).
  StubEngine e = MakeStubEngine(Fp8Setup("fp8_e4m3"));
  const std::vector<Result> on_gpu = RunConcurrently(*e.engine, reqs);
  int ties = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<int32_t>& a = on_gpu[i].tokens[0];
    const std::vector<int32_t>& b = on_cpu[i].tokens[0];
    REQUIRE(a.size() == static_cast<size_t>(len));
    const size_t same = std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin();
    WARN("request " << i << ": fp8 greedy tokens equal the CPU's for " << same << " of " << len);
    REQUIRE(same >= static_cast<size_t>(kSameTokens));
    const std::vector<int32_t> prompt = testing::Stories().tokenizer->Encode(reqs[i].prompt, true);
    ties += testing::RequireNearGreedy(*ref, prompt, a, kNearTie, 16);
  }
  WARN(ties << " of " << reqs.size() * len << " fp8 greedy tokens are not the CPU's argmax");
  REQUIRE(e.cuda->counters().graph_steps > 0);
  testing::RequireAllBlocksFree(*e.engine);
}

TEST_CASE("stub runner: a shipped fp8 checkpoint gives the logits of quantizing at load",
          "[cuda_stub]") {
  const std::string fp8_dir = testing::MakeTempDir("fp8_shipped");
  const std::string fp32_dir = testing::MakeTempDir("fp8_source");
  const LlamaWeights& w = testing::Stories().weights;
  REQUIRE(WriteHfFp8Directory(w, testing::Stories260kTokenizer(), fp8_dir, {}).ok());
  REQUIRE(WriteHfDirectory(w, testing::Stories260kTokenizer(), fp32_dir).ok());
  absl::StatusOr<LlamaWeights> shipped = LoadHfDirectory(fp8_dir);
  absl::StatusOr<LlamaWeights> source = LoadHfDirectory(fp32_dir);
  REQUIRE((shipped.ok() && source.ok()));

  StubSetup s = Fp8Setup("fp8_e4m3");
  s.max_num_seqs = 1;
  RunnerOptions o = testing::StubRunnerOptions(s);
  auto at_load = CreateModelRunner(*source, o);
  o.weight_dtype = "auto";  // as shipped
  auto as_shipped = CreateModelRunner(*shipped, o);
  INFO(at_load.status().ToString() << " / " << as_shipped.status().ToString());
  REQUIRE((at_load.ok() && as_shipped.ok()));
  REQUIRE((*as_shipped)->memory_info().weight_dtype == "fp8_e4m3+head bf16");
  // Quantized on the host at load (5 layers of 38,400 weights), shipped as is.
  REQUIRE((*at_load)->memory_info().quantized_weights == 5 * (128 * 64 + 64 * 64 + 3 * 172 * 64));
  REQUIRE((*as_shipped)->memory_info().quantized_weights == 0);
  std::mt19937 rng(4);
  std::vector<int32_t> prompt(20), tokens(12);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 500) + 3;
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 500) + 3;
  const auto a = testing::TeacherForced(**at_load, prompt, tokens, 8);
  const auto b = testing::TeacherForced(**as_shipped, prompt, tokens, 8);
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("step " << k);
    REQUIRE(std::memcmp(a[k].data(), b[k].data(), a[k].size() * 4) == 0);
  }
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

// A dummy model's fp8 weights are generated and quantized on the device
// (bf16 rows, QuantizeRowsFp8), never on the host: the same model
// materialized on the host and quantized there (from the fp32 values,
// before any bf16 rounding) gives nearly the same logits. They differ where
// a value's bf16 rounding moves its e4m3 code or its row's scale.
TEST_CASE("stub runner: dummy fp8 weights made on the device match the host's", "[cuda_stub]") {
  absl::StatusOr<LlamaWeights> shapes = LoadDummyModelShapes("tiny");
  absl::StatusOr<LlamaWeights> host = LoadDummyModel("tiny", uint64_t{1} << 30);
  REQUIRE((shapes.ok() && host.ok()));
  StubSetup s = Fp8Setup("fp8_e4m3");
  s.max_num_seqs = 1;
  RunnerOptions o = testing::StubRunnerOptions(s);
  o.weight_dtype_head = "fp8_e4m3";  // the tied head's own fp8 copy, generated too
  o.max_model_len = 256;
  REQUIRE(RunnerDefersDummyWeights(o));
  auto on_device = CreateModelRunner(*shapes, o);
  auto on_host = CreateModelRunner(*host, o);
  INFO(on_device.status().ToString() << " / " << on_host.status().ToString());
  REQUIRE((on_device.ok() && on_host.ok()));
  REQUIRE((*on_device)->memory_info().weight_dtype == "fp8_e4m3");
  REQUIRE((*on_device)->memory_info().weight_bytes == (*on_host)->memory_info().weight_bytes);
  std::mt19937 rng(8);
  std::vector<int32_t> prompt(24), tokens(8);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 500) + 3;
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 500) + 3;
  const auto a = testing::TeacherForced(**on_device, prompt, tokens, 8);
  const auto b = testing::TeacherForced(**on_host, prompt, tokens, 8);
  float worst = 0, range = 0;
  bool differ = false;
  for (size_t k = 0; k < a.size(); ++k) {
    for (size_t v = 0; v < a[k].size(); ++v) {
      REQUIRE(std::isfinite(a[k][v]));
      worst = std::max(worst, std::abs(a[k][v] - b[k][v]));
      range = std::max(range, std::abs(b[k][v]));
      differ |= a[k][v] != b[k][v];
    }
  }
  WARN("dummy tiny, fp8 made on the device vs on the host: max |logit diff| "
       << worst << " of logits up to " << range);
  REQUIRE(differ);  // really two paths
  REQUIRE(worst <= kDummyLogitDiff * range);
}

}  // namespace
}  // namespace kvserve
