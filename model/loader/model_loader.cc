#include "model/loader/model_loader.h"

#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/loader/dummy_model.h"
#include "model/loader/hf_loader.h"
#include "model/loader/llama2c_loader.h"
#include "model/tokenizer/hf_tokenizer.h"
#include "util/status_macros.h"

namespace kvserve {
namespace fs = std::filesystem;

namespace {

// The single *.model file beside a checkpoint.
absl::StatusOr<std::string> TokenizerBeside(const std::string& path) {
  std::vector<std::string> found;
  std::error_code ec;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".model" && e.is_regular_file()) {
      found.push_back(e.path().string());
    }
  }
  if (found.size() == 1) return found[0];
  return absl::NotFoundError(
      absl::StrCat(path, ": no tokenizer given and ", found.empty() ? "no" : "more than one",
                   " *.model file beside the checkpoint; pass --tokenizer FILE"));
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const std::string& tokenizer_path,
                                      bool defer_dummy_weights, FileAccess access) {
  LoadedModel m;
  LoadedTokenizer tok;
  if (path.rfind(kDummyPrefix, 0) == 0) {
    if (defer_dummy_weights) {
      KV_ASSIGN_OR_RETURN(m.weights, LoadDummyModelShapes(path));
    } else {
      KV_ASSIGN_OR_RETURN(m.weights, LoadDummyModel(path));
    }
    if (tokenizer_path.empty()) {
      tok.tokenizer = Tokenizer::ByteLevel(m.weights.config.vocab_size);
    } else {
      KV_ASSIGN_OR_RETURN(tok, LoadTokenizerFile(tokenizer_path));
    }
    // Random weights know nothing of token ids: take BOS/EOS from whatever
    // tokenizer the dummy model runs with.
    m.weights.config.bos_id = tok.tokenizer->bos_id();
    m.weights.config.eos_id = tok.tokenizer->eos_id();
  } else {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) {
      return absl::NotFoundError(
          absl::StrCat(path,
                       ": no such model (expected a llama2.c checkpoint, an HF directory or dummy:"
                       "<preset>)"));
    }
    if (fs::is_directory(st)) {
      KV_ASSIGN_OR_RETURN(m.weights, LoadHfDirectory(path, access));
      if (tokenizer_path.empty()) {
        KV_ASSIGN_OR_RETURN(tok, LoadHfDirectoryTokenizer(path));
      } else {
        KV_ASSIGN_OR_RETURN(tok, LoadTokenizerFile(tokenizer_path));
      }
      // The tokenizer's EOS (tokenizer_config.json's eos_token: <|eot_id|>
      // for Llama 3.1 Instruct, <|im_end|> for Qwen) ends generation too.
      if (tok.tokenizer->eos_id() >= 0) m.weights.config.AddStopId(tok.tokenizer->eos_id());
    } else {
      KV_ASSIGN_OR_RETURN(m.weights, LoadLlama2cCheckpoint(path, access));
      std::string file = tokenizer_path;
      if (file.empty()) {
        KV_ASSIGN_OR_RETURN(file, TokenizerBeside(path));
      }
      KV_ASSIGN_OR_RETURN(tok, LoadTokenizerFile(file));
    }
  }
  m.tokenizer = std::move(tok.tokenizer);
  m.special_tokens = std::move(tok.special_tokens);
  // Token ids past the embedding table would read out of bounds.
  if (m.tokenizer->vocab_size() > m.weights.config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the tokenizer has ", m.tokenizer->vocab_size(),
                     " tokens but the model's vocab_size is ", m.weights.config.vocab_size));
  }
  return m;
}

}  // namespace kvserve
