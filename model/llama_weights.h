// LlamaWeights: the fp32 host tensors of a Llama-family model, however it was
// loaded. Matrices are row-major [out_features, in_features] (the PyTorch /
// llama2.c convention), so y = W x is a GEMV over rows.
//
// The tensors are views; `storage` keeps whatever backs them alive (an mmap of
// an fp32 checkpoint, or vectors converted from fp16/bf16). A dummy model
// loaded for a device (LoadDummyModelShapes) has shapes but no data, and
// dummy_seed set: the runner generates the values (model/loader/dummy_model.h).
//
// With model.weight_dtype int8 or int4 (CPU only), QuantizeWeights
// (model/loader/quantize_weights.h) adds packed copies of the linear layers
// in `quantized` and records the choice in weight_quant; the fp32 tensors
// stay valid (embeddings and norms are read from them). A runner that
// cannot use them refuses them: CUDA takes only fp8_e4m3 (quantized at load
// the same way, or shipped so by an HF checkpoint, whose linear tensors then
// have shapes but no data), the CPU everything but fp8_e4m3.
//
// Thread-safety: immutable after loading; shared read-only by kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace kvserve {

struct QuantizedLinears;  // model/loader/quantize_weights.h

struct Tensor {
  const float* data = nullptr;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct LayerWeights {
  Tensor attn_norm;  // [dim]
  Tensor wq;         // [num_heads * head_dim, dim]
  Tensor wk;         // [num_kv_heads * head_dim, dim]
  Tensor wv;         // [num_kv_heads * head_dim, dim]
  Tensor wo;         // [dim, num_heads * head_dim]
  Tensor ffn_norm;   // [dim]
  Tensor w_gate;     // [hidden_dim, dim]   (llama2.c w1)
  Tensor w_down;     // [dim, hidden_dim]   (llama2.c w2)
  Tensor w_up;       // [hidden_dim, dim]   (llama2.c w3)
  // Present only where the config asks (data == nullptr otherwise):
  Tensor bq;      // [num_heads * head_dim]      qkv_bias
  Tensor bk;      // [num_kv_heads * head_dim]   qkv_bias
  Tensor bv;      // [num_kv_heads * head_dim]   qkv_bias
  Tensor bo;      // [dim]                        o_bias
  Tensor q_norm;  // [head_dim]                   qk_norm
  Tensor k_norm;  // [head_dim]                   qk_norm
};

struct LlamaWeights {
  ModelConfig config;
  Tensor tok_embeddings;  // [vocab_size, dim]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [dim]
  Tensor output;      // [vocab_size, dim]; aliases tok_embeddings when tied
  std::shared_ptr<void> storage;
  std::optional<uint64_t> dummy_seed;  // set: no data; generate from this seed
  // FingerprintHex of the weight files' bytes (several: of their
  // fingerprints in order); "" for a dummy model.
  std::string fingerprint;
  // The quantized linear layers (null unless weight_quant.any()).
  WeightQuantSpec weight_quant;
  std::shared_ptr<const QuantizedLinears> quantized;
};

}  // namespace kvserve
