// LoadModel: one entry point for every model source.
//   * a llama2.c checkpoint file (legacy or version-1 header)
//   * an HF directory: config.json + model.safetensors (or shards with
//     model.safetensors.index.json) + tokenizer.json or tokenizer.model
//   * "dummy:<preset>": random weights of a real shape (tiny, llama-2-7b,
//     llama-2-70b, llama-3-8b, mistral-7b, stories110m-shape)
// The tokenizer is `tokenizer_path` when given (a tokenizer.json or a
// SentencePiece .model); otherwise an HF directory's own (tokenizer.json
// preferred, tokenizer.model otherwise: hf_tokenizer.h), or the single
// *.model file beside a llama2.c checkpoint; dummy models fall back to a
// byte-level tokenizer. An HF model's stop ids include the tokenizer's EOS.
//
// Weight files are read into memory, or mmapped with FileAccess::kMmap
// (mapped_file.h: the risks); weights.fingerprint tells their bytes apart.
//
// With defer_dummy_weights, a dummy model comes back as shapes only
// (LoadDummyModelShapes: no host memory for the weights, dummy_seed set) for
// a runner that generates them on its device; see RunnerDefersDummyWeights.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"
#include "model/loader/mapped_file.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {

struct LoadedModel {
  LlamaWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  // bos_token / eos_token as text, for chat templates.
  SpecialTokenStrings special_tokens;
};

absl::StatusOr<LoadedModel> LoadModel(const std::string& path,
                                      const std::string& tokenizer_path = "",
                                      bool defer_dummy_weights = false,
                                      FileAccess access = FileAccess::kRead);

}  // namespace kvserve
