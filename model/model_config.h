// ModelConfig: the shape and hyper-parameters of a Llama-family model, however
// it was loaded (llama2.c checkpoint, HF directory, dummy preset).
//
// Thread-safety: immutable value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/sampling/sampling_params.h"

namespace kvserve {

// How RoPE pairs channels: llama2.c rotates adjacent pairs (2i, 2i+1); HF
// checkpoints rotate halves (i, i + head_dim/2) after their q/k row permutation.
enum class RopeStyle : uint8_t { kInterleaved, kNeox };

// RoPE frequency scaling (config.json "rope_scaling"), as transformers'
// rope utilities compute it:
//   linear:  every inverse frequency / factor;
//   llama3:  Llama 3.1's by-wavelength blend (low frequencies / factor, high
//            ones kept, a smooth ramp between, from original_max_position_
//            embeddings, low_freq_factor and high_freq_factor);
//   dynamic: NTK-aware base scaling once a sequence outgrows
//            original_max_position_embeddings. transformers recomputes the
//            base per forward from the current length, which cached keys
//            cannot follow (they keep the rotation they were written with),
//            so kvserve applies plain RoPE and keeps max_position_embeddings
//            as the limit: exact for every length the model was trained on.
enum class RopeScalingType : uint8_t { kNone, kLinear, kDynamic, kLlama3 };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int original_max_position_embeddings = 0;
};

struct ModelConfig {
  std::string name;          // e.g. "stories260k", "llama-3-8b"
  std::string architecture;  // "LlamaForCausalLM", "MistralForCausalLM"
  int dim = 0;               // hidden size
  int hidden_dim = 0;        // MLP intermediate size
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // dim / num_heads unless the checkpoint says otherwise
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  float rms_norm_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kNeox;
  bool tie_word_embeddings = false;
  int sliding_window = 0;  // 0: full attention
  // Variants: biases on the q/k/v projections (Qwen2; Llama's attention_bias
  // also sets o_bias), RMSNorm over each head of q and k before RoPE (Qwen3).
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  // llama2.c TinyStories checkpoints put BOS between stories: generating BOS
  // ends the text, as in llama2.c's run.c.
  bool bos_is_stop = false;
  // More ids that end generation besides eos_id: the rest of an eos_token_id
  // list in config.json or generation_config.json (Llama 3.1 Instruct stops
  // on <|end_of_text|>, <|eom_id|> and <|eot_id|>) and the tokenizer's own
  // EOS when it differs. Never holds eos_id itself.
  std::vector<int32_t> stop_ids;
  // Sampling defaults the checkpoint recommends (generation_config.json's
  // temperature, top_p, top_k); unset when it names none. A request that
  // does not set a parameter gets these (DefaultSampling), as vLLM does.
  std::optional<float> default_temperature;
  std::optional<float> default_top_p;
  std::optional<int32_t> default_top_k;

  // SamplingParams' defaults with the checkpoint's recommendations applied.
  SamplingParams DefaultSampling() const;

  // Adds `id` to stop_ids unless it is eos_id or already there.
  void AddStopId(int32_t id);
  // Whether generating `id` ends the text: eos_id, stop_ids, and BOS where
  // bos_is_stop.
  bool IsStopToken(int32_t id) const;

  // Checks every field; the error names the bad one.
  absl::Status Validate() const;
  // Number of parameters (embeddings and head included).
  int64_t NumParams() const;
  // RoPE inverse frequencies, one per channel pair [head_dim / 2], with
  // rope_scaling applied; fp32 arithmetic as in llama2.c's run.c (so
  // unscaled tables are bit-identical to it).
  std::vector<float> RopeInvFreq() const;
};

}  // namespace kvserve
