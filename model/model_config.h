// ModelConfig: the shape and hyper-parameters of a Llama-family model, however
// it was loaded (llama2.c checkpoint, HF directory, dummy preset).
//
// Thread-safety: immutable value type.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace kvserve {

// How RoPE pairs channels: llama2.c rotates adjacent pairs (2i, 2i+1); HF
// checkpoints rotate halves (i, i + head_dim/2) after their q/k row permutation.
enum class RopeStyle : uint8_t { kInterleaved, kNeox };

struct ModelConfig {
  std::string name;          // e.g. "stories260k", "llama-3-8b"
  std::string architecture;  // "LlamaForCausalLM", "MistralForCausalLM"
  int dim = 0;               // hidden size
  int hidden_dim = 0;        // MLP intermediate size
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;          // dim / num_heads unless the checkpoint says otherwise
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kNeox;
  bool tie_word_embeddings = false;
  int sliding_window = 0;    // 0: full attention
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  // llama2.c TinyStories checkpoints put BOS between stories: generating BOS
  // ends the text, as in llama2.c's run.c.
  bool bos_is_stop = false;

  // Checks every field; the error names the bad one.
  absl::Status Validate() const;
  // Number of parameters (embeddings and head included).
  int64_t NumParams() const;
};

}  // namespace kvserve
