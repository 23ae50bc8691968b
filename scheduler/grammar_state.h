// SequenceGrammar: one sequence's constrained-decoding state (a
// GrammarMatcher over the request's compiled grammar) and the token mask of
// its next draw; EngineGrammars: the engine's grammar compiler, built over
// the tokenizer's vocabulary at the first constrained request.
//
// The state advances only when a token is emitted, so it follows the
// sequence through preemption (recompute and swap keep the tokens), prefix
// cache hits (the grammar covers the output only) and n > 1 forks (a fork
// copies its parent's state before the first draw).
//
// End tokens (the request's stop ids) are allowed exactly where the grammar
// may end; a sequence whose grammar must end finishes at once ("stop"), and
// one whose state allows no token ends with an error instead of sampling.
//
// Thread-safety: SequenceGrammar is engine-thread only; EngineGrammars'
// Compile is safe from any thread (Submit).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/grammar/grammar_compiler.h"
#include "model/grammar/grammar_matcher.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {

class SequenceGrammar {
 public:
  explicit SequenceGrammar(std::shared_ptr<const CompiledGrammar> grammar)
      : matcher_(std::move(grammar)) {}

  // Computes the mask of the next draw; false when it allows no token.
  bool PrepareMask(std::span<const int32_t> end_ids);
  std::span<const uint32_t> mask() const { return mask_; }
  // Consumes the bytes of an emitted (non-end) token; false if rejected.
  bool Accept(std::string_view bytes) { return matcher_.AcceptBytes(bytes); }
  bool MustEnd() const { return matcher_.MustEnd(); }

 private:
  GrammarMatcher matcher_;
  std::vector<uint32_t> mask_;
};

class EngineGrammars {
 public:
  // Masks cover vocab_size ids (the model's logits row): ids the tokenizer
  // lacks have no bytes and are never allowed.
  EngineGrammars(std::shared_ptr<const Tokenizer> tokenizer, int32_t vocab_size)
      : tokenizer_(std::move(tokenizer)), vocab_size_(vocab_size) {}

  // InvalidArgument naming the field (the schema path where there is one).
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec);

 private:
  const std::shared_ptr<const Tokenizer> tokenizer_;
  const int32_t vocab_size_;
  std::once_flag once_;
  std::unique_ptr<GrammarCompiler> compiler_;
};

}  // namespace kvserve
