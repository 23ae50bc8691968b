// GrammarCompiler: GrammarSpec -> CompiledGrammar over one vocabulary, with
// a cache keyed by the spec (kind + text + choices), so the requests of one
// schema share one compiled grammar and its mask cache.
//
// Errors are InvalidArgument naming the request field and, for schemas, the
// path inside it ("response_format.json_schema.schema.properties.a.pattern:
// the JSON Schema keyword 'pattern' is not supported").
//
// Thread-safety: Compile is safe from any thread (front ends compile at
// Submit, not the engine thread); compiling runs outside the cache's lock.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/grammar/grammar_matcher.h"
#include "model/grammar/grammar_spec.h"
#include "model/grammar/token_vocab.h"

namespace kvserve {

// The grammar builder of a spec alone (no vocabulary), for tests and tools.
absl::Status BuildGrammar(const GrammarSpec& spec, GrammarBuilder* builder);

class GrammarCompiler {
 public:
  static constexpr size_t kMaxCached = 64;

  explicit GrammarCompiler(std::shared_ptr<const TokenVocab> vocab) : vocab_(std::move(vocab)) {}

  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec);
  const TokenVocab& vocab() const { return *vocab_; }
  int64_t cache_hits() const;

 private:
  const std::shared_ptr<const TokenVocab> vocab_;
  mutable absl::Mutex mu_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvserve
