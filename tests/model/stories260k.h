// stories260K (the reference model in ../shared) for the model tests: its
// weights and tokenizer, each loaded once per test binary.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/llama_weights.h"
#include "model/loader/llama2c_loader.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace kvserve::testing {

inline const LlamaWeights& Stories260k() {
  static const LlamaWeights* w = [] {
    auto loaded = LoadLlama2cCheckpoint(Stories260kCheckpoint());
    if (!loaded.ok()) FAIL(std::string(loaded.status().message()));
    return new LlamaWeights(std::move(*loaded));
  }();
  return *w;
}

inline const Tokenizer& Stories260kTok() {
  static const Tokenizer* t = [] {
    auto tok = Tokenizer::LoadSentencePiece(Stories260kTokenizer());
    if (!tok.ok()) FAIL(std::string(tok.status().message()));
    return tok->release();
  }();
  return *t;
}

// A TinyStories-style prompt (BOS first) of about 55 tokens; `longer` adds a
// sentence (about 80 tokens).
inline std::vector<int32_t> LilyPrompt(bool longer = false) {
  std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her dog. One day, she saw a big red ball under a tree.";
  if (longer) text += " She ran to get it and kicked it high into the sky.";
  return Stories260kTok().Encode(text, true);
}

}  // namespace kvserve::testing
