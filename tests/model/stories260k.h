// stories260K (the reference model in ../shared) for the model tests: its
// weights and tokenizer, each loaded once per test binary.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <utility>

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

}  // namespace kvserve::testing
