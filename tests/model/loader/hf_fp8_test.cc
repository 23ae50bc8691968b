// HF checkpoints shipped in fp8_e4m3 (config.json quantization_config of
// the compressed-tensors or "fp8" kind, F8_E4M3 weights with weight_scale
// tensors) load as shipped: the codes and scales reach QuantizedLinears
// byte for byte, per channel or per tensor; malformed or unsupported
// quantization_configs are errors naming the field; and fp8 weights are
// refused where they cannot run (the CPU runner, fp32 activations) with the
// key named. The device side (the same logits as weights quantized at
// load) is tests/cuda_stub/cuda_fp8_runner_stub_test.cc.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/cpu/kv/kv_quant.h"
#include "model/loader/hf_loader.h"
#include "model/loader/hf_writer.h"
#include "model/loader/llama2c_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/runner_factory.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

LlamaWeights Stories() {
  absl::StatusOr<LlamaWeights> w = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(w.ok());
  return std::move(*w);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// The fp8 directory of stories260K and the fp32 one it was made from.
struct Fp8Dirs {
  std::string fp8, fp32;
};
Fp8Dirs WriteDirs(const Fp8CheckpointOptions& o, const std::string& tag) {
  Fp8Dirs d{testing::MakeTempDir("fp8_" + tag), testing::MakeTempDir("fp32_" + tag)};
  REQUIRE(WriteHfFp8Directory(Stories(), testing::Stories260kTokenizer(), d.fp8, o).ok());
  REQUIRE(WriteHfDirectory(Stories(), testing::Stories260kTokenizer(), d.fp32).ok());
  return d;
}

TEST_CASE("an fp8 checkpoint loads as shipped", "[model][loader]") {
  for (bool per_tensor : {false, true}) {
    DYNAMIC_SECTION((per_tensor ? "per tensor (fp8)" : "per channel (compressed-tensors)")) {
      const Fp8Dirs d = WriteDirs({.per_tensor = per_tensor}, per_tensor ? "t" : "c");
      absl::StatusOr<LlamaWeights> fp8 = LoadHfDirectory(d.fp8);
      INFO(fp8.status().ToString());
      REQUIRE(fp8.ok());
      absl::StatusOr<LlamaWeights> fp32 = LoadHfDirectory(d.fp32);
      REQUIRE(fp32.ok());
      REQUIRE(fp8->weight_quant.body == WeightQuant::kFp8E4m3);
      REQUIRE(fp8->weight_quant.head == WeightQuant::kNone);  // tied: the embeddings
      REQUIRE(fp8->weight_quant.ToString() == "fp8_e4m3+head fp32");
      const QuantizedLinears& q = *fp8->quantized;
      REQUIRE(q.fp8_layers.size() == 5);
      // Norms and embeddings are the fp32 values; linear layers have shapes only.
      REQUIRE(std::memcmp(fp8->tok_embeddings.data, fp32->tok_embeddings.data,
                          fp32->tok_embeddings.numel() * 4) == 0);
      REQUIRE(fp8->layers[0].wq.data == nullptr);
      REQUIRE(fp8->layers[0].wq.shape == fp32->layers[0].wq.shape);
      for (int l = 0; l < 5; ++l) {
        const Tensor& w = fp32->layers[l].w_down;  // [64][172]
        const Fp8Matrix& got = q.fp8_layers[l].w_down;
        const Fp8Matrix per_row = Fp8Matrix::Quantize(w.data, w.shape[0], w.shape[1]);
        REQUIRE(got.rows == 64);
        REQUIRE(got.cols == 172);
        if (per_tensor) {
          const float s = *std::max_element(per_row.scales.begin(), per_row.scales.end());
          REQUIRE(got.scales == std::vector<float>(64, s));
          REQUIRE(got.codes[5] == cpu::FloatToFp8E4m3(w.data[5] / s));
        } else {
          REQUIRE(got.codes == per_row.codes);
          REQUIRE(got.scales == per_row.scales);
        }
      }
    }
  }
}

// config.json of `dir` with quantization_config replaced by `q`.
void SetQuantizationConfig(const std::string& dir, const nlohmann::json& q) {
  nlohmann::json c = nlohmann::json::parse(testing::ReadFileOrDie(dir + "/config.json"));
  c["quantization_config"] = q;
  std::ofstream(dir + "/config.json") << c.dump(2);
}

// A shipped fp8 checkpoint keeps its head as shipped under weight_dtype
// fp8_e4m3 with the head on auto, even where auto would make a large
// vocabulary's head fp8 (compressed-tensors checkpoints ignore lm_head).
TEST_CASE("shipped fp8 weights under model.weight_dtype: fp8_e4m3", "[model][loader]") {
  LlamaWeights w;
  w.config.vocab_size = 128256;
  w.weight_quant = {.body = WeightQuant::kFp8E4m3, .head = WeightQuant::kNone, .head_auto = false};
  w.quantized = std::make_shared<QuantizedLinears>();
  REQUIRE(QuantizeWeights(*ParseWeightQuant("fp8_e4m3"), &w).ok());
  REQUIRE(QuantizeWeights(*ParseWeightQuant("auto"), &w).ok());
  REQUIRE(w.weight_quant.head == WeightQuant::kNone);
  REQUIRE(Message(QuantizeWeights(*ParseWeightQuant("fp8_e4m3", "fp8_e4m3"), &w)) ==
          "model.weight_dtype: the weights are already quantized as fp8_e4m3+head fp32, not "
          "fp8_e4m3");
  REQUIRE(Message(QuantizeWeights(*ParseWeightQuant("int8"), &w)) ==
          "model.weight_dtype: the weights are already quantized as fp8_e4m3+head fp32, not "
          "int8");
}

TEST_CASE("a malformed or unsupported quantization_config names the field", "[model][loader]") {
  const Fp8Dirs d = WriteDirs({}, "bad");
  const std::string cfg = d.fp8 + "/config.json";
  auto error = [&](const nlohmann::json& q) {
    SetQuantizationConfig(d.fp8, q);
    absl::StatusOr<LlamaWeights> w = LoadHfDirectory(d.fp8);
    REQUIRE_FALSE(w.ok());
    return Message(w.status());
  };
  REQUIRE(error("fp8") == cfg + ": field 'quantization_config' is not an object: \"fp8\"");
  REQUIRE(error({{"activation_scheme", "dynamic"}}) ==
          cfg + ": field 'quantization_config.quant_method' is missing");
  REQUIRE(error({{"quant_method", "awq"}}) ==
          cfg +
              ": field 'quantization_config.quant_method' is 'awq'; supported: fp8 and "
              "compressed-tensors (fp8_e4m3 weights)");
  REQUIRE(error({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}) ==
          cfg +
              ": field 'quantization_config.weight_block_size' is [128,128]; block-wise fp8 "
              "scales are not supported (per-tensor and per-channel weight_scale are)");
  REQUIRE(error({{"quant_method", "fp8"}, {"fmt", "e5m2"}}) ==
          cfg + ": field 'quantization_config.fmt' is \"e5m2\"; only \"e4m3\" is supported");
  REQUIRE(error({{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}}) ==
          cfg +
              ": field 'quantization_config.config_groups' is missing or not an object of "
              "schemes");
  const nlohmann::json int4 = {{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}};
  REQUIRE(error({{"quant_method", "compressed-tensors"},
                 {"config_groups", {{"group_0", {{"weights", int4}}}}}}) ==
          cfg +
              ": field 'quantization_config.config_groups.group_0.weights' is num_bits 4, type "
              "\"int\"; only fp8 weights (num_bits 8, type \"float\") are supported");
  const nlohmann::json block = {{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}};
  REQUIRE(error({{"quant_method", "compressed-tensors"},
                 {"config_groups", {{"g", {{"weights", block}}}}}}) ==
          cfg +
              ": field 'quantization_config.config_groups.g.weights.strategy' is \"block\"; "
              "supported: \"tensor\" and \"channel\" (not block or group)");
  REQUIRE(error({{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}}) ==
          cfg +
              ": field 'quantization_config.format' is \"pack-quantized\"; supported: "
              "\"float-quantized\" and \"naive-quantized\" (fp8)");
  // A valid config over full-precision weights: the first linear tensor is named.
  SetQuantizationConfig(d.fp32, {{"quant_method", "fp8"}});
  absl::StatusOr<LlamaWeights> w = LoadHfDirectory(d.fp32);
  REQUIRE(Message(w.status()) ==
          "tensor 'model.layers.0.self_attn.q_proj.weight' is F32 in an fp8 checkpoint "
          "(config.json quantization_config): every linear layer must be F8_E4M3 (only the head "
          "may stay in full precision)");
}

TEST_CASE("fp8_e4m3 weights where they cannot run: errors name the key", "[model]") {
  RunnerOptions o;
  o.weight_dtype = "fp8_e4m3";
  const std::string cpu =
      "model.weight_dtype: fp8_e4m3 weights run on CUDA only (model.device: cuda); the CPU "
      "runner takes fp32, int8, int4 or int4_asym";
  REQUIRE(Message(CheckRunnerDevice(o)) == cpu);
  REQUIRE(Message(CreateModelRunner(Stories(), o).status()) == cpu);
  o.weight_dtype = "auto";
  o.weight_dtype_head = "fp8";
  REQUIRE(Message(CheckRunnerDevice(o)) == cpu);
  // A checkpoint shipped in fp8, asked for nothing, on the CPU.
  const Fp8Dirs d = WriteDirs({}, "cpu");
  absl::StatusOr<LlamaWeights> shipped = LoadHfDirectory(d.fp8);
  REQUIRE(shipped.ok());
  o.weight_dtype_head = "auto";
  REQUIRE(Message(CreateModelRunner(*shipped, o).status()) ==
          "model.weight_dtype: the checkpoint's fp8_e4m3 weights run on CUDA only (model.device: "
          "cuda); the CPU runner takes fp32, int8, int4 or int4_asym");
  // fp32 activations on CUDA (checked before the device is looked for).
  o.device = "cuda";
  o.dtype = "fp32";
  o.weight_dtype = "fp8_e4m3";
  REQUIRE(Message(CheckRunnerDevice(o)) ==
          "model.weight_dtype: fp8_e4m3 weights need bf16 or fp16 activations (model.dtype: bf16, "
          "fp16 or auto); cuBLASLt's fp8 GEMMs take no fp32 activations");
  o.dtype = "fp32";
  o.weight_dtype = "auto";
  REQUIRE(Message(CreateModelRunner(*shipped, o).status()) ==
          "model.weight_dtype: fp8_e4m3 weights need bf16 or fp16 activations (model.dtype: bf16, "
          "fp16 or auto); cuBLASLt's fp8 GEMMs take no fp32 activations");
  // fp8 beside a CPU dtype, and the names.
  REQUIRE(Message(ParseWeightQuant("fp8_e4m3", "int8").status()) ==
          "model.weight_dtype_head: int8 beside model.weight_dtype: fp8_e4m3: fp8_e4m3 runs on "
          "the CUDA runner, int8 and int4 on the CPU runner; pick one kind");
  REQUIRE(ParseWeightQuant("fp8")->Resolve(128256).head == WeightQuant::kFp8E4m3);
  REQUIRE(ParseWeightQuant("fp8")->Resolve(512).head == WeightQuant::kNone);
  REQUIRE(ParseWeightQuant("FP8_E4M3", "fp8")->ToString() == "fp8_e4m3");
}

TEST_CASE("DeviceFp8WeightBytesFor counts the fp8 layout", "[model]") {
  const ModelConfig c = Stories().config;  // tied, vocab 512: the head stays bf16
  const int64_t bf16 = c.NumParams() * 2;
  const WeightQuantSpec fp8 = *ParseWeightQuant("fp8_e4m3");
  // Per layer: wqkv 128 x 64, wo 64 x 64, w_gate_up 344 x 64, w_down 64 x 176 (172 padded)
  // in bytes, one fp32 scale a row (600 rows), in place of 2 bytes a weight.
  const int64_t layer_fp8 = 128 * 64 + 64 * 64 + 344 * 64 + 64 * 176 + 600 * 4;
  const int64_t layer_bf16 = 2 * (128 * 64 + 64 * 64 + 344 * 64 + 64 * 172);
  REQUIRE(DeviceFp8WeightBytesFor(c, fp8) == bf16 + 5 * (layer_fp8 - layer_bf16));
  // An fp8 head on the tied table: its own copy, the embeddings stay.
  const WeightQuantSpec head = *ParseWeightQuant("fp8_e4m3", "fp8_e4m3");
  REQUIRE(DeviceFp8WeightBytesFor(c, head) == DeviceFp8WeightBytesFor(c, fp8) + 512 * 64 + 512 * 4);
}

}  // namespace
}  // namespace kvserve
