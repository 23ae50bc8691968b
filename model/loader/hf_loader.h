// Loads a Hugging Face Llama-family model directory:
//   config.json                      LlamaForCausalLM, MistralForCausalLM,
//                                    Qwen2ForCausalLM (q/k/v biases) or
//                                    Qwen3ForCausalLM (per-head q/k RMSNorm);
//                                    rope_scaling linear / dynamic / llama3,
//                                    explicit head_dim, attention_bias,
//                                    tie_word_embeddings, sliding_window
//   model.safetensors                one file, or
//   model.safetensors.index.json     {"weight_map": {tensor: shard file}} + shards
//   generation_config.json           optional: stop ids, sampling defaults
//                                    (generation_config.h)
//   tokenizer.json / tokenizer.model (resolved by LoadModel, not here)
// Tensors may be F32, F16 or BF16; all become fp32 (F32 in place from the
// mmap). Every tensor's shape is checked against config.json. A checkpoint
// shipped in fp8 (config.json quantization_config of the "fp8" or
// compressed-tensors kind, per-tensor or per-channel, see hf_loader.cc)
// keeps its F8_E4M3 linear layers as shipped: their codes and weight_scale
// go to weights.quantized (fp8_layers, and fp8_output for an F8_E4M3 head),
// the LayerWeights tensors of those layers carry shapes only, and
// weight_quant says fp8_e4m3 (the CUDA runner's; the CPU runner refuses it).
//
// HF checkpoints store wq/wk rows permuted for rotate-half RoPE, so the
// config says RopeStyle::kNeox. `"kvserve_bos_is_stop": true` in config.json
// (written by `kvserve convert` for llama2.c TinyStories models) makes BOS a
// stop token, as it is when the same model is loaded from its .bin.
//
// Errors: a missing file or tensor is NotFound naming what was searched; a
// bad field or shape is InvalidArgument naming the file, the field and what
// was expected; truncated data is DataLoss.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"
#include "model/loader/mapped_file.h"

namespace kvserve {

// The per-layer tensors under "model.layers.N.", shared with the writer so
// the two cannot drift apart.
struct HfLayerTensor {
  const char* suffix;  // e.g. "self_attn.q_proj.weight"
  Tensor LayerWeights::*member;
};
inline constexpr HfLayerTensor kHfLayerTensors[] = {
    {"input_layernorm.weight", &LayerWeights::attn_norm},
    {"self_attn.q_proj.weight", &LayerWeights::wq},
    {"self_attn.k_proj.weight", &LayerWeights::wk},
    {"self_attn.v_proj.weight", &LayerWeights::wv},
    {"self_attn.o_proj.weight", &LayerWeights::wo},
    {"post_attention_layernorm.weight", &LayerWeights::ffn_norm},
    {"mlp.gate_proj.weight", &LayerWeights::w_gate},
    {"mlp.up_proj.weight", &LayerWeights::w_up},
    {"mlp.down_proj.weight", &LayerWeights::w_down},
};
// Per-layer tensors only some variants carry (ModelConfig says which).
inline constexpr HfLayerTensor kHfQkvBiasTensors[] = {
    {"self_attn.q_proj.bias", &LayerWeights::bq},
    {"self_attn.k_proj.bias", &LayerWeights::bk},
    {"self_attn.v_proj.bias", &LayerWeights::bv},
};
inline constexpr HfLayerTensor kHfOBiasTensor = {"self_attn.o_proj.bias", &LayerWeights::bo};
inline constexpr HfLayerTensor kHfQkNormTensors[] = {
    {"self_attn.q_norm.weight", &LayerWeights::q_norm},
    {"self_attn.k_norm.weight", &LayerWeights::k_norm},
};
inline constexpr char kHfEmbeddings[] = "model.embed_tokens.weight";
inline constexpr char kHfFinalNorm[] = "model.norm.weight";
inline constexpr char kHfLmHead[] = "lm_head.weight";
std::string HfLayerTensorName(int layer, const char* suffix);

// Parses config.json (its path is named in every error).
absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& config_path);

// Loads config and weights of the HF directory `dir`.
absl::StatusOr<LlamaWeights> LoadHfDirectory(const std::string& dir,
                                             FileAccess access = FileAccess::kRead);

}  // namespace kvserve
