// ModelConfig: the shape and hyper-parameters of a Llama-family model, however
// it was loaded (llama2.c checkpoint, HF directory, dummy preset).
//
// Thread-safety: immutable value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// model.weight_dtype: the linear layers' weights as the CPU forward pass
// multiplies them (kernels/cpu/quant/quant_matrix.h). kNone keeps them as
// loaded (model.dtype); int8 is symmetric per output channel, int4 symmetric
// per group of `group_size` inputs with fp16 scales (llama.cpp's q4_0),
// int4_asym the same with an fp16 offset per group too (q4_1: 5 bits a
// weight at group 32 instead of 4.5; on stories260K +5.3% perplexity
// instead of int4's +8.0%). Embeddings and norms
// stay in full precision. The output head has its own choice
// (model.weight_dtype_head); auto keeps it in fp32 for vocabularies under
// kInt8HeadMinVocab tokens, where it is a small share of the bytes and an
// error in it moves every logit (stories260K's int8 head alone costs 2
// greedy flips in 200 teacher-forced steps, and free-running greedy text
// parts from fp32's after 61 tokens instead of agreeing for all 200), and
// makes it int8 for larger ones (Llama 3's 128k x 4096 head is 2 GiB in fp32).
//
// fp8_e4m3 (the CUDA runner only, kernels/cuda/layers/gemm.h): e4m3 codes with one
// fp32 scale per output channel (absmax / 448), multiplied by cuBLASLt's fp8
// GEMMs against activations quantized per token at run time; its head rule
// is int8's with fp8 in int8's place. It does not mix with the CPU dtypes.
//
// The int4 group defaults to 32 (llama.cpp's q4_0 group, 4.5 bits a
// weight with the fp16 scales): stories260K's rows have only 64 or 172
// inputs, and a group of 128 would spread one scale over a whole row
// there; 128 (4.1 bits) is the choice for big models where bandwidth counts
// more.
enum class WeightQuant : uint8_t { kNone, kInt8, kInt4, kInt4Asym, kFp8E4m3 };
// "fp32", "int8", "int4", "int4_asym", "fp8_e4m3"
std::string_view WeightQuantName(WeightQuant q);
inline bool IsInt4(WeightQuant q) { return q == WeightQuant::kInt4 || q == WeightQuant::kInt4Asym; }

inline constexpr int kInt8HeadMinVocab = 32768;

struct WeightQuantSpec {
  WeightQuant body = WeightQuant::kNone;
  WeightQuant head = WeightQuant::kNone;
  bool head_auto = true;  // head follows the rule above (Resolve)
  int group_size = 32;    // int4 inputs per scale: a positive multiple of 8
  // Whether anything is (or, with head_auto, may be) quantized.
  bool any() const {
    return body != WeightQuant::kNone || head != WeightQuant::kNone ||
           (head_auto && body != WeightQuant::kNone);
  }
  bool operator==(const WeightQuantSpec&) const = default;
  // Whether the body or the head is fp8_e4m3 (the CUDA runner's dtype).
  bool fp8() const { return body == WeightQuant::kFp8E4m3 || head == WeightQuant::kFp8E4m3; }
  // The head decided for a vocabulary (head_auto cleared).
  WeightQuantSpec Resolve(int vocab_size) const;
  // The body's dtype ("fp32", "int8", "int4", "int4_asym"), "+head <dtype>" where the
  // head differs from it, "/g<N>" for an int4 group other than 32.
  std::string ToString() const;
};

// model.weight_dtype (auto, fp32, fp16, bf16: no quantization; int8, int4, int4_asym,
// fp8_e4m3), model.weight_dtype_head (auto: the rule above; fp32, int8, int4, int4_asym,
// fp8_e4m3) and model.weight_group_size (a multiple of 8 in [8, 4096]). Errors name the
// key; fp8_e4m3 beside an int8 / int4 body or head is refused (the runners are others).
absl::StatusOr<WeightQuantSpec> ParseWeightQuant(std::string_view body,
                                                 std::string_view head = "auto",
                                                 int group_size = 32);

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
