#include "model/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"
#include "model/grammar/json_schema.h"
#include "model/grammar/regex.h"

namespace kvserve {

absl::Status BuildGrammar(const GrammarSpec& spec, GrammarBuilder* b) {
  const RuleId root = b->NewRule("root");
  switch (spec.kind) {
    case GrammarSpec::Kind::kNone:
      return absl::InvalidArgumentError(absl::StrCat(spec.field, ": no constraint"));
    case GrammarSpec::Kind::kJsonSchema:
      return BuildJsonSchemaGrammar(spec.text, spec.field, b, root);
    case GrammarSpec::Kind::kJsonObject:
      BuildJsonObjectGrammar(b, root);
      return absl::OkStatus();
    case GrammarSpec::Kind::kRegex: {
      absl::StatusOr<ExprId> e = BuildRegexExpr(spec.text, spec.field, b);
      if (!e.ok()) return e.status();
      b->SetBody(root, *e);
      return absl::OkStatus();
    }
    case GrammarSpec::Kind::kChoice: {
      if (spec.choices.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(spec.field, ": needs at least one choice"));
      }
      std::vector<ExprId> alts;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        if (spec.choices[i].empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(spec.field, "[", i, "]: a choice must not be empty"));
        }
        alts.push_back(b->Literal(spec.choices[i]));
      }
      b->SetBody(root, b->Alt(std::move(alts)));
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown grammar kind");
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const GrammarSpec& spec) {
  std::string key =
      absl::StrCat(static_cast<int>(spec.kind), ":", spec.text.size(), ":", spec.text);
  for (const std::string& c : spec.choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
  }
  // The field names the error; the cache key leaves it out, so the same
  // schema from another field reuses the grammar.
  GrammarBuilder b;
  if (absl::Status s = BuildGrammar(spec, &b); !s.ok()) return s;
  auto compiled = std::make_shared<const CompiledGrammar>(b.Lower(), vocab_);
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  if (lru_.size() > kMaxCached) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledGrammar>(compiled);
}

int64_t GrammarCompiler::cache_hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

}  // namespace kvserve
