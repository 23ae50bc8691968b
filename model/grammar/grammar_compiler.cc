#include "model/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"
#include "model/grammar/gbnf.h"
#include "model/grammar/json_schema.h"
#include "model/grammar/regex.h"
#include "util/status_macros.h"

namespace kvserve {

namespace {

absl::Status BuildRules(const GrammarSpec& spec, GrammarBuilder* b) {
  const RuleId root = b->NewRule("root");
  switch (spec.kind) {
    case GrammarSpec::Kind::kNone:
      return absl::InvalidArgumentError(absl::StrCat(spec.field, ": no constraint"));
    case GrammarSpec::Kind::kJsonSchema: {
      if (spec.prefix.empty() && spec.suffix.empty()) {
        return BuildJsonSchemaGrammar(spec.text, spec.field, b, root);
      }
      const RuleId value = b->NewRule("value");
      KV_RETURN_IF_ERROR(BuildJsonSchemaGrammar(spec.text, spec.field, b, value));
      b->SetBody(root, b->Seq({b->Literal(spec.prefix), b->Ref(value), b->Literal(spec.suffix)}));
      return absl::OkStatus();
    }
    case GrammarSpec::Kind::kJsonObject:
      BuildJsonObjectGrammar(b, root);
      return absl::OkStatus();
    case GrammarSpec::Kind::kGbnf:
      return BuildGbnfGrammar(spec.text, spec.field, b, root);
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

}  // namespace

absl::Status BuildGrammar(const GrammarSpec& spec, GrammarBuilder* b) {
  KV_RETURN_IF_ERROR(BuildRules(spec, b));
  if (b->LoweredStates(kMaxGrammarStates + 1) > kMaxGrammarStates) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.field, ": the grammar expands to more than ", kMaxGrammarStates,
                     " states (bounded repeats nested in one another multiply); use smaller "
                     "counts or unbounded repeats"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const GrammarSpec& spec) {
  std::string key =
      absl::StrCat(static_cast<int>(spec.kind), ":", spec.text.size(), ":", spec.text);
  for (const std::string& c : spec.choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  absl::StrAppend(&key, ":", spec.prefix.size(), ":", spec.prefix, ":", spec.suffix);
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
