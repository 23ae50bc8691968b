// The CUDA model runner on stories260K through the CUDA stand-in (every
// kernel run on the CPU by cuda_sim), with small limits (stub_engine.h):
//   - fp32 weights and fp32 KV reproduce llama2.c's greedy text exactly,
//     with CUDA graphs (every step replays the bucket-1 graph) and without;
//   - every KV format, a per-layer list included, gives the CPU runner's
//     greedy tokens for a few prompts run together (prefill chunked across
//     block boundaries and eager, decode from graphs);
//   - int4_kc (alone and in a per-layer list) and int2_kc give the greedy tokens of
//     the CPU forward with fp16 tails, the CUDA runner's tail precision
//     (tests/model/cuda/fp16_tail_cpu_runner.h says why not the CPU
//     runner's fp32 tails);
// and every engine test ends with every block back in the pool.
//
// Why these token assertions also hold on a real GPU: the stand-in runs the
// kernels' own source, built -ffp-contract=off, and the kernels round every
// product and sum as the CPU kernels do (kernels/cuda/device/exact_math.cuh: the
// _rn intrinsics, exact expf/logf helpers, fixed reduction orders), so the
// fp16/bf16/fp8 conversions, quantization codes and softmax are the same
// bits on a device; what differs is the GEMMs' summation order (cuBLASLt's
// tiles against the CPU's and the stand-in's reference loop), a few ulps of
// an fp32 logit, which greedy tokens of stories260K do not feel over these
// lengths (the [gpu] suite, tests/model/cuda, asserts the same tokens on an
// H200 over 100).
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_stub/stub_engine.h"
#include "tests/model/cuda/teacher_forced.h"

namespace kvserve {
namespace {

using testing::Greedy;
using testing::MakeStubEngine;
using testing::RandomSnippet;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunConcurrently;
using testing::RunOne;
using testing::StubEngine;
using testing::StubSetup;

TEST_CASE("stub runner: fp32 weights and KV reproduce the golden text", "[cuda_stub]") {
  for (bool graphs : {true, false}) {
    DYNAMIC_SECTION("cuda graphs " << graphs) {
      StubSetup s;
      s.cuda_graphs = graphs;
      StubEngine t = MakeStubEngine(s);
      Result r = RunOne(*t.engine, Greedy("", 256));
      REQUIRE(r.text[0] == testing::GoldenGreedyText());
      REQUIRE(r.usage.completion_tokens == 256);
      if (graphs) {
        REQUIRE(t.cuda->graph_buckets().front() == 1);
        REQUIRE(t.cuda->counters().graph_steps == 256);
        REQUIRE(t.cuda->counters().eager_steps == 0);
      } else {
        REQUIRE(t.cuda->graph_buckets().empty());
        REQUIRE(t.cuda->counters().eager_steps == 256);
      }
      // Every GEMM shape's algorithm was timed (the stand-in offers two
      // candidates), here or by an earlier runner of the process: none was
      // first met inside a graph capture, where it would go untimed.
      const CudaModelRunner::GemmStats g = t.cuda->gemm_stats();
      REQUIRE(g.shapes >= 4);  // qkv, o, gate_up, down, the LM head
      REQUIRE(g.tuned + g.memo_hits == g.shapes);
      RequireAllBlocksFree(*t.engine);
    }
  }
}

// BOS alone and three dev-set snippets, `len` greedy tokens each.
std::vector<GenerateRequest> FormatRequests(int len) {
  std::mt19937 rng(23);
  std::vector<GenerateRequest> reqs;
  reqs.push_back(Greedy("", len));
  for (int i = 0; i < 3; ++i) reqs.push_back(Greedy(RandomSnippet(rng, 120), len));
  for (GenerateRequest& r : reqs) r.ignore_eos = true;
  return reqs;
}

// The CUDA runner against `reference` ("cpu" or "cpu_fp16_tails") for
// kv_dtype `spec`.
void RequireReferenceTokens(const std::string& spec, const char* reference, int len) {
  const std::vector<GenerateRequest> reqs = FormatRequests(len);
  StubSetup gpu;
  gpu.kv_dtype = spec;
  StubSetup ref = gpu;
  ref.device = reference;
  StubEngine g = MakeStubEngine(gpu);
  StubEngine c = MakeStubEngine(ref);
  std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
  std::vector<Result> on_ref = RunConcurrently(*c.engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i << ": '" << reqs[i].prompt << "'");
    REQUIRE(on_gpu[i].tokens[0].size() == static_cast<size_t>(len));
    REQUIRE(on_gpu[i].tokens[0] == on_ref[i].tokens[0]);
  }
  REQUIRE(g.cuda->counters().graph_steps > 0);
  REQUIRE(g.cuda->counters().eager_steps > 0);
  RequireAllBlocksFree(*g.engine);
  RequireAllBlocksFree(*c.engine);
}

// fp16, bf16 and fp8 elements, int8 codes on an fp32 scale: a one-ulp
// difference in a K or V input (the GEMMs' summation order) moves a
// dequantized value by at most one fine step, logits by about 1e-3 at most
// (measured here, teacher-forced: fp16 2e-3, bf16 7e-5, the others 1e-5),
// under the top-2 margins of these greedy runs.
TEST_CASE("stub runner: 8- and 16-bit KV formats give the CPU runner's greedy tokens",
          "[cuda_stub][fiber_order]") {
  for (const char* spec :
       {"fp16", "bf16", "fp8_e4m3", "int8", "k8v4", "fp16,bf16,int8*,k8v4,fp8_e4m3"}) {
    DYNAMIC_SECTION("kv " << spec) { RequireReferenceTokens(spec, "cpu", 40); }
  }
}

// 4-bit KV. A 4-bit level is a sixteenth of a group's (or a channel's)
// range, and a group's fp16 scale and zero round on a 2^-11 grid: a
// one-ulp difference in an fp32 input (the GEMMs' summation order, which
// differs between cuBLASLt, the stand-in's reference GEMM and the CPU's
// FMA chains) lands on the other side of a rounding boundary now and then,
// and moves that value by a whole level. Measured here (request 3's prompt,
// teacher-forced): K/V inputs equal to ~1e-6, then one flipped fp16 scale
// in layer 1 at index 6; logits differ by up to 2.8 from there on, and the
// greedy tokens part. The CPU alone does the same: its scalar GEMM
// (KVSERVE_CPU_ISA=scalar) against its AVX2 one gives other int4 tokens
// for that prompt from position 15. So no backend reproduces another's
// 4-bit greedy tokens exactly, on the stand-in or on a device; what holds
// is that every token the CUDA runner picks is the reference's choice, or
// within kNearTie of it, given the same history: the reference's logits
// for the CUDA runner's own tokens (teacher forcing) rank the CUDA token
// within kNearTie of the maximum, and at most a tenth of the steps are such
// near ties. (Observed: flips to tokens 0.004 to 0.12 below the maximum.)
constexpr float kNearTie = 0.5f;

void RequireNearGreedy(const std::string& spec, const char* reference, int len) {
  const std::vector<GenerateRequest> reqs = FormatRequests(len);
  StubSetup gpu;
  gpu.kv_dtype = spec;
  StubEngine g = MakeStubEngine(gpu);
  const std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
  RequireAllBlocksFree(*g.engine);
  int steps = 0, ties = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i << ": '" << reqs[i].prompt << "'");
    const std::vector<int32_t>& tokens = on_gpu[i].tokens[0];
    REQUIRE(tokens.size() == static_cast<size_t>(len));
    StubSetup ref = gpu;
    ref.device = reference;
    ref.max_num_seqs = 1;
    const std::unique_ptr<ModelRunner> runner = testing::MakeStubRunner(ref);
    const std::vector<int32_t> prompt = testing::Stories().tokenizer->Encode(reqs[i].prompt, true);
    ties += testing::RequireNearGreedy(*runner, prompt, tokens, kNearTie);
    steps += len;
  }
  INFO(ties << " of " << steps << " tokens are the reference's near ties");
  REQUIRE(ties * 10 <= steps);
}

TEST_CASE("stub runner: 4-bit KV formats pick the reference's greedy tokens or near ties",
          "[cuda_stub][fiber_order]") {
  for (const char* spec : {"int4", "fp16,int4*"}) {
    DYNAMIC_SECTION("kv " << spec) { RequireNearGreedy(spec, "cpu", 64); }
  }
  for (const char* spec : {"int4_kc", "int8,int4_kc*,k8v4", "int2_kc"}) {
    DYNAMIC_SECTION("kv " << spec) { RequireNearGreedy(spec, "cpu_fp16_tails", 64); }
  }
}

// Swaps run on the copy engines (cudaMemcpy2DAsync on a side stream,
// ordered by events): a block swapped out, overwritten on the device by a
// copy-on-write copy, and swapped back in elsewhere comes back with every
// layer's bytes, for evenly spaced layers (one 2D copy a block) and for a
// per-layer dtype list (one copy a layer).
TEST_CASE("stub runner: swapped blocks come back byte for byte from the copy engines",
          "[cuda_stub][fiber_order]") {
  for (const char* spec : {"fp32", "int8,fp16,int8*"}) {
    INFO("kv " << spec);
    StubSetup s;
    s.kv_dtype = spec;
    s.num_swap_blocks = 4;
    std::unique_ptr<ModelRunner> runner = testing::MakeStubRunner(s);
    auto* cuda = dynamic_cast<CudaModelRunner*>(runner.get());
    REQUIRE(cuda != nullptr);
    std::mt19937 rng(3);
    std::vector<int32_t> prompt(40), tokens(4);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 500) + 3;
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 500) + 3;
    testing::TeacherForced(*runner, prompt, tokens, 16);  // fills blocks 0..2
    const int layers = runner->config().num_layers;
    const auto read = [&](int layer, int32_t block) {
      absl::StatusOr<std::vector<uint8_t>> b = cuda->ReadBlock(layer, block);
      REQUIRE(b.ok());
      return *b;
    };
    std::vector<std::vector<uint8_t>> want1, want2;
    for (int l = 0; l < layers; ++l) {
      want1.push_back(read(l, 1));
      want2.push_back(read(l, 2));
      REQUIRE(want1.back() != want2.back());
    }
    const BlockCopy out[] = {{1, 2}}, overwrite[] = {{2, 1}}, in[] = {{2, 5}};
    REQUIRE(runner->SwapOut(out).ok());           // device 1 -> swap 2
    REQUIRE(runner->CopyBlocks(overwrite).ok());  // device 2 -> device 1
    REQUIRE(runner->SwapIn(in).ok());             // swap 2 -> device 5
    for (int l = 0; l < layers; ++l) {
      INFO("layer " << l);
      REQUIRE(read(l, 5) == want1[l]);
      REQUIRE(read(l, 1) == want2[l]);
    }
  }
}

}  // namespace
}  // namespace kvserve
