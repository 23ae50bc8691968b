// RandomWeights: a LlamaWeights of any config filled with seeded random
// values, every optional tensor the config asks for included (biases, q/k
// norms). Norm weights are 1 + noise so a missing or misplaced norm shows.
// For tests that write small checkpoints of real model shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/llama_weights.h"

namespace kvserve::testing {

inline LlamaWeights RandomWeights(const ModelConfig& c, uint32_t seed) {
  auto store = std::make_shared<std::vector<std::vector<float>>>();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto make = [&](std::vector<int64_t> shape, float mean, float std) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float>& buf = store->emplace_back(n);
    for (float& x : buf) x = mean + std * normal(rng);
    return Tensor{buf.data(), std::move(shape)};
  };
  store->reserve(64);
  const int64_t dim = c.dim, hid = c.hidden_dim, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim;
  const float w = 0.15f;
  LlamaWeights out;
  out.config = c;
  out.tok_embeddings = make({c.vocab_size, dim}, 0.0f, 1.0f);
  out.layers.resize(c.num_layers);
  for (LayerWeights& l : out.layers) {
    l.attn_norm = make({dim}, 1.0f, 0.2f);
    l.wq = make({q, dim}, 0.0f, w);
    l.wk = make({kv, dim}, 0.0f, w);
    l.wv = make({kv, dim}, 0.0f, w);
    l.wo = make({dim, q}, 0.0f, w);
    l.ffn_norm = make({dim}, 1.0f, 0.2f);
    l.w_gate = make({hid, dim}, 0.0f, w);
    l.w_down = make({dim, hid}, 0.0f, w);
    l.w_up = make({hid, dim}, 0.0f, w);
    if (c.qkv_bias) {
      l.bq = make({q}, 0.0f, 0.5f);
      l.bk = make({kv}, 0.0f, 0.5f);
      l.bv = make({kv}, 0.0f, 0.5f);
    }
    if (c.o_bias) l.bo = make({dim}, 0.0f, 0.5f);
    if (c.qk_norm) {
      l.q_norm = make({c.head_dim}, 1.0f, 0.3f);
      l.k_norm = make({c.head_dim}, 1.0f, 0.3f);
    }
  }
  out.final_norm = make({dim}, 1.0f, 0.2f);
  out.output = c.tie_word_embeddings ? out.tok_embeddings : make({c.vocab_size, dim}, 0.0f, w);
  out.storage = store;
  return out;
}

}  // namespace kvserve::testing
