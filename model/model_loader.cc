#include "model/model_loader.h"

#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/status_macros.h"
#include "model/llama2c_loader.h"

namespace kvserve {
namespace fs = std::filesystem;

namespace {

// The single *.model file beside a checkpoint.
absl::StatusOr<std::string> TokenizerBeside(const std::string& path) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path(), ec)) {
    if (e.path().extension() == ".model") found.push_back(e.path().string());
  }
  if (found.size() == 1) return found[0];
  return absl::NotFoundError(absl::StrCat(
      path, ": no tokenizer given and ", found.empty() ? "no" : "more than one",
      " *.model file beside the checkpoint; pass --tokenizer FILE"));
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const std::string& tokenizer_path) {
  LoadedModel m;
  KV_ASSIGN_OR_RETURN(m.weights, LoadLlama2cCheckpoint(path));
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    KV_ASSIGN_OR_RETURN(tok, TokenizerBeside(path));
  }
  KV_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::LoadSentencePiece(tok));
  return m;
}

}  // namespace kvserve
