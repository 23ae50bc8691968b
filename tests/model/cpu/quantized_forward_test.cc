// model.weight_dtype int8 / int4 on the CPU runner, on stories260K: greedy
// tokens against fp32's, batch and thread invariance of the quantized rows,
// quantization at load from every checkpoint kind, and the start-up errors
// that name the key.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/loader/hf_writer.h"
#include "model/loader/llama2c_loader.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/runner_factory.h"
#include "tests/model/stories260k.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

using testing::Stories260k;

std::unique_ptr<ModelRunner> MakeRunner(const LlamaWeights& w, const std::string& dtype,
                                        int threads = 1, const std::string& head = "auto") {
  RunnerOptions o;
  o.weight_dtype = dtype;
  o.weight_dtype_head = head;
  o.num_blocks = (w.config.max_position_embeddings + 15) / 16;
  o.max_num_seqs = 1;
  o.num_threads = threads;
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(w, o);
  if (!r.ok()) FAIL(Message(r.status()));
  return std::move(*r);
}

// One sequence in blocks 0, 1, ...: `prompt` in chunks of `chunk` tokens,
// then greedy decode to `total` tokens. Returns the tokens after the prompt
// and, in *last_logits, the logits of the final prompt row.
std::vector<int32_t> Greedy(ModelRunner& runner, std::vector<int32_t> tokens, int total,
                            int chunk = 1 << 30, std::vector<float>* prompt_logits = nullptr) {
  const ModelConfig& c = runner.config();
  const int bs = runner.kv_format().block_size();
  const int32_t max_blocks = (c.max_position_embeddings + bs - 1) / bs;
  const size_t prompt = tokens.size();
  std::vector<float> logits(c.vocab_size);
  int32_t cached = 0;
  while (static_cast<int>(tokens.size()) < total) {
    const int32_t n =
        std::min<int32_t>(static_cast<int32_t>(tokens.size()) - cached, std::max(1, chunk));
    BatchInput b;
    b.Clear();
    b.max_blocks_per_seq = max_blocks;
    for (int32_t i = cached; i < cached + n; ++i) {
      b.token_ids.push_back(tokens[i]);
      b.positions.push_back(i);
      b.slot_mapping.push_back(i);  // block i / bs is block id i / bs
    }
    b.query_start.push_back(n);
    b.context_len.push_back(cached + n);
    for (int32_t j = 0; j < max_blocks; ++j) b.block_table.push_back(j * bs < cached + n ? j : -1);
    b.logits_rows.push_back(n - 1);
    REQUIRE(runner.Forward(b, logits).ok());
    cached += n;
    if (cached < static_cast<int32_t>(tokens.size())) continue;  // prompt not done
    if (prompt_logits != nullptr && cached == static_cast<int32_t>(prompt)) *prompt_logits = logits;
    tokens.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  return std::vector<int32_t>(tokens.begin() + prompt, tokens.end());
}

int Agreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

TEST_CASE("int8 weights: stories260K greedy tokens from BOS equal fp32's for the first 64",
          "[model]") {
  const std::vector<int32_t> fp32 = Greedy(*MakeRunner(Stories260k(), "fp32"), {1}, 257);
  const std::vector<int32_t> int8 = Greedy(*MakeRunner(Stories260k(), "int8"), {1}, 257);
  const std::vector<int32_t> int4 = Greedy(*MakeRunner(Stories260k(), "int4"), {1}, 257);
  const int a8 = Agreement(fp32, int8), a4 = Agreement(fp32, int4);
  std::printf(
      "stories260K greedy from BOS, 256 tokens: int8 weights agree with fp32 for the first "
      "%d, int4 for the first %d\n",
      a8, a4);
  REQUIRE(fp32.size() == 256);
  REQUIRE(a8 >= 64);
  // int4 is not held to 64 tokens (3% ppl is the goal there), but it must
  // still be the same model: the opening tokens agree.
  REQUIRE(a4 >= 4);
}

TEST_CASE("Quantized weights: a row's logits do not depend on prefill chunking or threads",
          "[model]") {
  // 40 prompt tokens from the model's own greedy text.
  std::vector<int32_t> prompt = {1};
  {
    const std::vector<int32_t> g = Greedy(*MakeRunner(Stories260k(), "fp32"), {1}, 40);
    prompt.insert(prompt.end(), g.begin(), g.end());
  }
  for (const char* dtype : {"int8", "int4", "int4_asym"}) {
    INFO(dtype);
    std::vector<float> one_step, by_token, two_threads;
    const std::vector<int32_t> a =
        Greedy(*MakeRunner(Stories260k(), dtype, 1), prompt, 60, 1 << 30, &one_step);
    const std::vector<int32_t> b =
        Greedy(*MakeRunner(Stories260k(), dtype, 1), prompt, 60, 1, &by_token);
    const std::vector<int32_t> c =
        Greedy(*MakeRunner(Stories260k(), dtype, 2), prompt, 60, 7, &two_threads);
    REQUIRE(a == b);
    REQUIRE(a == c);
    REQUIRE(one_step.size() == 512);
    REQUIRE(std::memcmp(one_step.data(), by_token.data(), 512 * sizeof(float)) == 0);
    REQUIRE(std::memcmp(one_step.data(), two_threads.data(), 512 * sizeof(float)) == 0);
  }
}

TEST_CASE("Quantized weights: the head rule and the reported weight bytes", "[model]") {
  auto fp32 = MakeRunner(Stories260k(), "fp32");
  auto int8 = MakeRunner(Stories260k(), "int8");
  auto int8_head = MakeRunner(Stories260k(), "int8", 1, "int8");
  auto int4 = MakeRunner(Stories260k(), "int4");
  auto int4_asym = MakeRunner(Stories260k(), "int4_asym");
  REQUIRE(fp32->memory_info().weight_dtype == "fp32");
  // A 512-token vocabulary keeps its head in fp32 by default.
  REQUIRE(int8->memory_info().weight_dtype == "int8+head fp32");
  REQUIRE(int8_head->memory_info().weight_dtype == "int8");
  REQUIRE(int4->memory_info().weight_dtype == "int4+head fp32");
  REQUIRE(int4_asym->memory_info().weight_dtype == "int4_asym+head fp32");
  const ModelConfig& c = Stories260k().config;
  REQUIRE(fp32->memory_info().weight_bytes == c.NumParams() * 4);
  // stories260K ties its head to the embeddings, which stay fp32 beside the
  // quantized head copy: int8 + head adds bytes to the fp32 embeddings.
  REQUIRE(int8->memory_info().weight_bytes < fp32->memory_info().weight_bytes);
  REQUIRE(int4->memory_info().weight_bytes < int8->memory_info().weight_bytes);
  // int4_asym: one more fp16 a group (an offset beside each scale).
  REQUIRE(int4_asym->memory_info().weight_bytes > int4->memory_info().weight_bytes);
  REQUIRE(int4_asym->memory_info().weight_bytes < int8->memory_info().weight_bytes);
  REQUIRE(int8_head->memory_info().weight_bytes > int8->memory_info().weight_bytes);
  // The int8 head: greedy text parts from fp32's after 61 tokens (a 0.07
  // logit tie at token 62); still the same model.
  const std::vector<int32_t> ref = Greedy(*fp32, {1}, 65);
  const int a = Agreement(ref, Greedy(*int8_head, {1}, 65));
  std::printf(
      "stories260K greedy from BOS: int8 weights with an int8 head agree with fp32 for the "
      "first %d tokens\n",
      a);
  REQUIRE(a >= 32);
}

TEST_CASE("ForwardWeightBytesFor counts what QuantizeWeights makes", "[model]") {
  absl::StatusOr<LoadedModel> tiny = LoadModel("dummy:tiny");  // tied head, dim 128
  REQUIRE(tiny.ok());
  const LlamaWeights* models[] = {&Stories260k(), &tiny->weights};
  for (const LlamaWeights* w : models) {
    for (const char* spec : {"fp32", "int8", "int4", "int4_asym"}) {
      for (const char* head : {"auto", "int8", "int4", "int4_asym"}) {
        for (int group : {32, 128}) {
          INFO(w->config.name << " " << spec << " head " << head << " group " << group);
          const WeightQuantSpec q = *ParseWeightQuant(spec, head, group);
          LlamaWeights copy = *w;
          REQUIRE(QuantizeWeights(q, &copy).ok());
          REQUIRE(ForwardWeightBytesFor(w->config, q) == ForwardWeightBytes(copy));
        }
      }
    }
  }
  // stories110m-shape: the bytes a decode step streams, per dtype.
  absl::StatusOr<ModelConfig> c = [] {
    absl::StatusOr<LoadedModel> m = LoadModel("dummy:stories110m-shape", "", true);
    return m.ok() ? absl::StatusOr<ModelConfig>(m->weights.config) : m.status();
  }();
  REQUIRE(c.ok());
  const int64_t fp32 = ForwardWeightBytesFor(*c, *ParseWeightQuant("fp32"));
  const int64_t int8 = ForwardWeightBytesFor(*c, *ParseWeightQuant("int8"));
  const int64_t int4 = ForwardWeightBytesFor(*c, *ParseWeightQuant("int4"));
  const int64_t int4_asym = ForwardWeightBytesFor(*c, *ParseWeightQuant("int4_asym"));
  std::printf("stories110m-shape weight bytes: fp32 %lld, int8 %lld, int4 %lld, int4_asym %lld\n",
              static_cast<long long>(fp32), static_cast<long long>(int8),
              static_cast<long long>(int4), static_cast<long long>(int4_asym));
  REQUIRE(fp32 == c->NumParams() * 4);
  REQUIRE(int8 < fp32 / 3);
  REQUIRE(int4 < int8 * 6 / 10);
  // 5 bits a weight instead of 4.5 in the body (the fp32 embeddings stay).
  REQUIRE(int4_asym > int4);
  REQUIRE(int4_asym < int8 * 7 / 10);
}

TEST_CASE("Quantized weights load from llama2.c, HF safetensors and dummy checkpoints", "[model]") {
  const std::string dir = testing::MakeTempDir("quant_hf");
  REQUIRE(
      WriteHfDirectory(Stories260k(), testing::Stories260kTokenizer(), dir, SafetensorsDtype::kBF16)
          .ok());
  for (const std::string& path :
       {testing::Stories260kCheckpoint(), dir, std::string("dummy:tiny")}) {
    INFO(path);
    absl::StatusOr<LoadedModel> m = LoadModel(path);
    REQUIRE(m.ok());
    for (const char* dtype : {"int8", "int4", "int4_asym"}) {
      std::unique_ptr<ModelRunner> r = MakeRunner(m->weights, dtype);
      REQUIRE(r->memory_info().weight_dtype == std::string(dtype) + "+head fp32");
      // Runs, and greedy agrees with the same checkpoint in fp32 at first.
      const std::vector<int32_t> q = Greedy(*r, {1}, 9);
      const std::vector<int32_t> f = Greedy(*MakeRunner(m->weights, "fp32"), {1}, 9);
      REQUIRE(q.size() == 8);
      REQUIRE(q[0] == f[0]);
    }
  }
}

TEST_CASE("model.weight_dtype errors name the key", "[model]") {
  REQUIRE(Message(ParseWeightQuant("int5").status()) ==
          "model.weight_dtype: expected auto, fp32, fp16, bf16, int8, int4, int4_asym or fp8_e4m3, "
          "got 'int5'");
  REQUIRE(ParseWeightQuant("fp8_e4m3")->body == WeightQuant::kFp8E4m3);
  REQUIRE(Message(ParseWeightQuant("int8", "int2").status()) ==
          "model.weight_dtype_head: expected auto, fp32, fp16, bf16, int8, int4, int4_asym or "
          "fp8_e4m3, got 'int2'");
  REQUIRE(Message(ParseWeightQuant("int4", "auto", 12).status()) ==
          "model.weight_group_size: expected a multiple of 8 in [8, 4096] (32 or 128), got 12");
  REQUIRE(ParseWeightQuant("INT4")->body == WeightQuant::kInt4);
  REQUIRE(ParseWeightQuant("int4_asym")->body == WeightQuant::kInt4Asym);
  REQUIRE(ParseWeightQuant("int4_asym", "auto", 128)->Resolve(512).ToString() ==
          "int4_asym+head fp32/g128");
  REQUIRE(ParseWeightQuant("int8", "int4_asym")->head == WeightQuant::kInt4Asym);
  // The documented head rule: fp32 under 32768 tokens, int8 from there.
  REQUIRE(ParseWeightQuant("int4")->Resolve(32000).head == WeightQuant::kNone);
  REQUIRE(ParseWeightQuant("int4")->Resolve(32768).head == WeightQuant::kInt8);
  REQUIRE(ParseWeightQuant("fp32")->Resolve(128256).head == WeightQuant::kNone);
  REQUIRE(ParseWeightQuant("bf16")->any() == false);
  REQUIRE(ParseWeightQuant("auto", "int4")->head == WeightQuant::kInt4);

  RunnerOptions o;
  o.device = "cuda";
  o.weight_dtype = "int4";
  const std::string want =
      "model.weight_dtype: int4 weights run on the CPU only (model.device: cpu); cuda takes fp32, "
      "fp16 or bf16 weights (model.dtype) or fp8_e4m3";
  REQUIRE(Message(CheckRunnerDevice(o)) == want);
  REQUIRE(Message(CreateModelRunner(Stories260k(), o).status()) == want);
  o.device = "cpu";
  o.weight_dtype = "int3";
  REQUIRE(Message(CreateModelRunner(Stories260k(), o).status()) ==
          "model.weight_dtype: expected auto, fp32, fp16, bf16, int8, int4, int4_asym or fp8_e4m3, "
          "got 'int3'");
  // Weights quantized already (by an earlier runner's options) go nowhere else.
  LlamaWeights w = Stories260k();
  WeightQuantSpec spec = *ParseWeightQuant("int8");
  REQUIRE(QuantizeWeights(spec, &w).ok());
  REQUIRE(Message(QuantizeWeights(*ParseWeightQuant("int4"), &w)) ==
          "model.weight_dtype: the weights are already quantized as int8+head fp32, not "
          "int4+head fp32");
  o.device = "cuda";
  o.weight_dtype = "auto";
  REQUIRE(Message(CreateModelRunner(w, o).status()) ==
          "model.weight_dtype: int8+head fp32 weights run on the CPU only (model.device: cpu); "
          "cuda takes fp32, fp16 or bf16 weights (model.dtype) or fp8_e4m3");
}

}  // namespace
}  // namespace kvserve
