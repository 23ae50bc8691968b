// Writes models as Hugging Face directories (what `kvserve convert` does), so
// the HF loading path runs on real weights.
//
// llama2.c rotates adjacent channel pairs (2i, 2i+1) with RoPE; HF Llama
// rotates halves (i, i + head_dim/2). HF's own conversion script makes the two
// agree by permuting the rows of wq and wk inside every head: row 2i+j of a
// head moves to row j*head_dim/2 + i, i.e. in PyTorch terms
//   w.view(n_heads, head_dim/2, 2, dim).transpose(1, 2).reshape(n_heads*head_dim, dim).
// The product q.k per head is unchanged, so the converted model computes the
// same function; the HF loader then uses RopeStyle::kNeox.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/llama_weights.h"
#include "model/loader/safetensors.h"

namespace kvserve {

// The rows of an interleaved-RoPE wq/wk [num_heads*head_dim, cols], reordered
// for rotate-half RoPE, and the inverse.
std::vector<float> PermuteRowsForRotateHalf(const Tensor& w, int num_heads, int head_dim);
std::vector<float> UnpermuteRowsFromRotateHalf(const Tensor& w, int num_heads, int head_dim);

struct NamedTensor {
  std::string name;
  Tensor tensor;  // fp32 source data
};

// Writes `tensors` (in that order) as one safetensors file of `dtype`, with
// "__metadata__" {"format": "pt"} plus `metadata`. The header is padded so the
// data section starts 8-byte aligned.
absl::Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                              SafetensorsDtype dtype,
                              const std::map<std::string, std::string>& metadata = {});

// A tensor of any safetensors dtype, as bytes (an F8_E4M3 matrix, say).
struct RawTensor {
  std::string name;
  std::string dtype;  // "F8_E4M3", "F32", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
absl::Status WriteSafetensorsRaw(const std::string& path, std::span<const RawTensor> tensors);

// Writes `w` into `out_dir` (created if needed) as config.json,
// model.safetensors, generation_config.json and tokenizer.model (a copy of
// `tokenizer_path`). Interleaved-RoPE weights (llama2.c) get their wq/wk rows
// permuted; bos_is_stop becomes "kvserve_bos_is_stop" in config.json.
absl::Status WriteHfDirectory(const LlamaWeights& w, const std::string& tokenizer_path,
                              const std::string& out_dir,
                              SafetensorsDtype dtype = SafetensorsDtype::kF32);

// The same directory as an fp8_e4m3 checkpoint shipped on the hub: every
// linear layer (and an untied head when `fp8_head`) F8_E4M3 with its
// weight_scale (model/loader/quantize_weights.h's rule: per output channel,
// [out, 1] in F32, as compressed-tensors' "channel" strategy writes it; with
// per_tensor, one scale [] for the whole matrix and the codes of w / that
// scale, as quant_method "fp8" writes it), the rest F32, and config.json's
// quantization_config saying so. For tests of the loader (hf_loader.h).
struct Fp8CheckpointOptions {
  bool per_tensor = false;  // quant_method "fp8" (else compressed-tensors, per channel)
  bool fp8_head = false;
};
absl::Status WriteHfFp8Directory(const LlamaWeights& w, const std::string& tokenizer_path,
                                 const std::string& out_dir, const Fp8CheckpointOptions& options);

}  // namespace kvserve
