#include "scheduler/grammar_state.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/field_status.h"

namespace kvserve {

bool SequenceGrammar::PrepareMask(std::span<const int32_t> end_ids) {
  const TokenVocab& vocab = matcher_.grammar().vocab();
  mask_.resize(vocab.mask_words());
  int32_t allowed = matcher_.FillMask(mask_);
  if (matcher_.CanEnd()) {
    for (int32_t id : end_ids) {
      if (id < 0 || id >= vocab.vocab_size()) continue;
      mask_[id >> 5] |= uint32_t{1} << (id & 31);
      ++allowed;
    }
  }
  return allowed > 0;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> EngineGrammars::Compile(
    const GrammarSpec& spec) {
  std::call_once(once_, [this] {
    std::vector<std::string> bytes(vocab_size_);
    const int32_t known = std::min(vocab_size_, tokenizer_->vocab_size());
    const int32_t prev = TokenVocab::MidTextPrev(*tokenizer_);
    for (int32_t id = 0; id < known; ++id) bytes[id] = tokenizer_->TokenBytes(id, prev);
    compiler_ =
        std::make_unique<GrammarCompiler>(std::make_shared<const TokenVocab>(std::move(bytes)));
  });
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = compiler_->Compile(spec);
  if (g.ok()) {
    if ((*g)->initial().threads.empty()) {
      return FieldError(spec.field, absl::StrCat(spec.field,
                                                 ": matches only the empty text, so no token "
                                                 "can be generated"));
    }
    return g;
  }
  // "path: what" names the path; the field is the path.
  const std::string message(g.status().message());
  const size_t colon = message.find(": ");
  return FieldError(colon == std::string::npos ? spec.field : message.substr(0, colon), message);
}

}  // namespace kvserve
