#include "model/grammar/grammar.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace kvserve {

GrammarBuilder::GrammarBuilder() { exprs_.push_back(GrammarExpr{}); }  // 0: empty

ExprId GrammarBuilder::Empty() { return 0; }

ExprId GrammarBuilder::Class(const ByteSet& bytes) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kClass;
  e.bytes = bytes;
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::Byte(uint8_t b) {
  ByteSet s;
  s.Add(b);
  return Class(s);
}

ExprId GrammarBuilder::Literal(std::string_view text) {
  std::vector<ExprId> parts;
  parts.reserve(text.size());
  for (char c : text) parts.push_back(Byte(static_cast<uint8_t>(c)));
  return Seq(std::move(parts));
}

ExprId GrammarBuilder::Seq(std::vector<ExprId> parts) {
  if (parts.empty()) return Empty();
  if (parts.size() == 1) return parts[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kSeq;
  e.children = std::move(parts);
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::Alt(std::vector<ExprId> options) {
  if (options.size() == 1) return options[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kAlt;  // no options: matches nothing
  e.children = std::move(options);
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::Repeat(ExprId child, int32_t min, int32_t max) {
  if (min < 0 || min > kMaxRepeat || (max != kUnbounded && (max < min || max > kMaxRepeat))) {
    std::abort();  // callers check counts against kMaxRepeat and report them
  }
  if (min == 1 && max == 1) return child;
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kRepeat;
  e.children = {child};
  e.min = min;
  e.max = max;
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

RuleId GrammarBuilder::NewRule(std::string name) {
  rules_.push_back(Rule{std::move(name), -1});
  return static_cast<RuleId>(rules_.size() - 1);
}

void GrammarBuilder::SetBody(RuleId rule, ExprId body) { rules_[rule].body = body; }

ExprId GrammarBuilder::Ref(RuleId rule) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kRef;
  e.rule = rule;
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

int32_t GrammarBuilder::NewState(GrammarNfa* nfa) const {
  nfa->states.emplace_back();
  return static_cast<int32_t>(nfa->states.size() - 1);
}

namespace {

void AddEps(GrammarNfa* nfa, int32_t from, int32_t to) {
  nfa->states[from].edges.push_back(GrammarNfa::Edge{-1, -1, to});
}

int32_t InternByteSet(GrammarNfa* nfa, const ByteSet& s) {
  for (size_t i = 0; i < nfa->bytesets.size(); ++i) {
    if (nfa->bytesets[i] == s) return static_cast<int32_t>(i);
  }
  nfa->bytesets.push_back(s);
  return static_cast<int32_t>(nfa->bytesets.size() - 1);
}

}  // namespace

// Thompson construction: returns (entry, exit) states of the fragment.
std::pair<int32_t, int32_t> GrammarBuilder::LowerExpr(ExprId id, GrammarNfa* nfa, int32_t rule,
                                                      const std::vector<bool>& nullable) const {
  const GrammarExpr& e = exprs_[id];
  switch (e.kind) {
    case GrammarExpr::Kind::kEmpty: {
      const int32_t s = NewState(nfa);
      return {s, s};
    }
    case GrammarExpr::Kind::kClass: {
      const int32_t s = NewState(nfa), t = NewState(nfa);
      nfa->states[s].edges.push_back(GrammarNfa::Edge{InternByteSet(nfa, e.bytes), -1, t});
      nfa->states[s].consumes = true;
      return {s, t};
    }
    case GrammarExpr::Kind::kSeq: {
      auto [entry, exit] = LowerExpr(e.children[0], nfa, rule, nullable);
      for (size_t i = 1; i < e.children.size(); ++i) {
        auto [s, t] = LowerExpr(e.children[i], nfa, rule, nullable);
        AddEps(nfa, exit, s);
        exit = t;
      }
      return {entry, exit};
    }
    case GrammarExpr::Kind::kAlt: {
      const int32_t s = NewState(nfa), t = NewState(nfa);
      for (ExprId c : e.children) {
        auto [cs, ct] = LowerExpr(c, nfa, rule, nullable);
        AddEps(nfa, s, cs);
        AddEps(nfa, ct, t);
      }
      return {s, t};
    }
    case GrammarExpr::Kind::kRepeat: {
      // A copy's states are made after its entry and before the next
      // fragment: copy c is [entry, entry + size).
      GrammarNfa::RepeatCopies copies;
      auto copy = [&]() {
        const int32_t before = static_cast<int32_t>(nfa->states.size());
        auto [cs, ct] = LowerExpr(e.children[0], nfa, rule, nullable);
        copies.entry.push_back(cs);
        copies.size = static_cast<int32_t>(nfa->states.size()) - before;
        return std::pair<int32_t, int32_t>{cs, ct};
      };
      const int32_t s = NewState(nfa);
      int32_t exit = s;
      for (int32_t i = 0; i < e.min; ++i) {
        auto [cs, ct] = copy();
        AddEps(nfa, exit, cs);
        exit = ct;
      }
      const int32_t t = NewState(nfa);
      if (e.max == kUnbounded) {
        auto [cs, ct] = LowerExpr(e.children[0], nfa, rule, nullable);
        AddEps(nfa, exit, cs);
        AddEps(nfa, ct, exit);
        AddEps(nfa, exit, t);
      } else {
        for (int32_t i = e.min; i < e.max; ++i) {
          auto [cs, ct] = copy();
          AddEps(nfa, exit, t);
          AddEps(nfa, exit, cs);
          exit = ct;
        }
        AddEps(nfa, exit, t);
        if (e.max >= 2 && !nullable[e.children[0]]) {
          copies.min = e.min;
          nfa->repeats.push_back(std::move(copies));
        }
      }
      return {s, t};
    }
    case GrammarExpr::Kind::kRef: {
      const int32_t s = NewState(nfa), t = NewState(nfa);
      nfa->states[s].edges.push_back(GrammarNfa::Edge{-1, e.rule, t});
      return {s, t};
    }
  }
  std::abort();
}

int64_t GrammarBuilder::LoweredStates(int64_t cap) const {
  // Per expression, memoized: repeats share their child's id.
  std::vector<int64_t> memo(exprs_.size(), -1);
  auto add = [cap](int64_t a, int64_t b) { return std::min(cap, a + b); };
  auto mul = [cap](int64_t a, int64_t n) { return n != 0 && a > cap / n ? cap : a * n; };
  auto count = [&](auto&& self, ExprId id) -> int64_t {
    if (memo[id] >= 0) return memo[id];
    const GrammarExpr& e = exprs_[id];
    int64_t n = 0;
    switch (e.kind) {
      case GrammarExpr::Kind::kEmpty:
        n = 1;
        break;
      case GrammarExpr::Kind::kClass:
      case GrammarExpr::Kind::kRef:
        n = 2;
        break;
      case GrammarExpr::Kind::kSeq:
      case GrammarExpr::Kind::kAlt:
        n = e.kind == GrammarExpr::Kind::kAlt ? 2 : 0;
        for (ExprId c : e.children) n = add(n, self(self, c));
        break;
      case GrammarExpr::Kind::kRepeat: {
        const int64_t child = self(self, e.children[0]);
        const int64_t copies = e.max == kUnbounded ? e.min + 1 : e.max;
        n = add(2, mul(child, copies));
        break;
      }
    }
    return memo[id] = n;
  };
  int64_t total = 0;
  for (const Rule& r : rules_) {
    total = add(total, 2);
    if (r.body >= 0) total = add(total, count(count, r.body));
  }
  return total;
}

std::vector<bool> GrammarBuilder::Nullable() const {
  // The least fixpoint over rules: a rule is nullable once its body is.
  std::vector<bool> rule_nullable(rules_.size(), false);
  std::vector<bool> nullable(exprs_.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    // Children have smaller ids than their parents, except through Ref.
    for (size_t id = 0; id < exprs_.size(); ++id) {
      const GrammarExpr& e = exprs_[id];
      bool n = false;
      switch (e.kind) {
        case GrammarExpr::Kind::kEmpty:
          n = true;
          break;
        case GrammarExpr::Kind::kClass:
          break;
        case GrammarExpr::Kind::kSeq:
          n = std::all_of(e.children.begin(), e.children.end(),
                          [&](ExprId c) { return static_cast<bool>(nullable[c]); });
          break;
        case GrammarExpr::Kind::kAlt:
          n = std::any_of(e.children.begin(), e.children.end(),
                          [&](ExprId c) { return static_cast<bool>(nullable[c]); });
          break;
        case GrammarExpr::Kind::kRepeat:
          n = e.min == 0 || nullable[e.children[0]];
          break;
        case GrammarExpr::Kind::kRef:
          n = rule_nullable[e.rule];
          break;
      }
      if (n && !nullable[id]) {
        nullable[id] = true;
        changed = true;
      }
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!rule_nullable[r] && rules_[r].body >= 0 && nullable[rules_[r].body]) {
        rule_nullable[r] = true;
        changed = true;
      }
    }
  }
  return nullable;
}

GrammarNfa GrammarBuilder::Lower() const {
  GrammarNfa nfa;
  const std::vector<bool> nullable = Nullable();
  nfa.rule_start.resize(rules_.size());
  nfa.rule_shared.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    nfa.rule_shared[r] = rules_[r].shared;
    const int32_t start = NewState(&nfa);
    const int32_t end = NewState(&nfa);
    nfa.rule_start[r] = start;
    if (rules_[r].body >= 0) {
      auto [s, t] = LowerExpr(rules_[r].body, &nfa, static_cast<int32_t>(r), nullable);
      AddEps(&nfa, start, s);
      AddEps(&nfa, t, end);
    }
    nfa.states[end].rule_end = static_cast<int32_t>(r);
    // A rule's states are the ones made from its start to the next rule's.
    nfa.state_rule.resize(nfa.states.size(), static_cast<int32_t>(r));
  }
  // Innermost repeats were recorded before the ones around them: walking
  // back, each repeat finds its parent in state_repeat, then claims its
  // copies' states.
  nfa.state_repeat.assign(nfa.states.size(), -1);
  for (int32_t r = static_cast<int32_t>(nfa.repeats.size()) - 1; r >= 0; --r) {
    GrammarNfa::RepeatCopies& rep = nfa.repeats[r];
    rep.parent = nfa.state_repeat[rep.entry[0]];
    for (int32_t entry : rep.entry) {
      std::fill(nfa.state_repeat.begin() + entry, nfa.state_repeat.begin() + entry + rep.size, r);
    }
  }
  return nfa;
}

ExprId Utf8Char(GrammarBuilder* b, const ByteSet& exclude_ascii) {
  ByteSet ascii;
  ascii.AddRange(0x00, 0x7f);
  for (int i = 0; i < 2; ++i) ascii.bits[i] &= ~exclude_ascii.bits[i];
  auto range = [b](uint8_t lo, uint8_t hi) {
    ByteSet r;
    r.AddRange(lo, hi);
    return b->Class(r);
  };
  const ExprId c = range(0x80, 0xbf);
  // Well-formed UTF-8 only (RFC 3629): no overlong forms, no surrogates,
  // nothing above U+10FFFF.
  return b->Alt({b->Class(ascii), b->Seq({range(0xc2, 0xdf), c}),
                 b->Seq({b->Byte(0xe0), range(0xa0, 0xbf), c}), b->Seq({range(0xe1, 0xec), c, c}),
                 b->Seq({b->Byte(0xed), range(0x80, 0x9f), c}), b->Seq({range(0xee, 0xef), c, c}),
                 b->Seq({b->Byte(0xf0), range(0x90, 0xbf), c, c}),
                 b->Seq({range(0xf1, 0xf3), c, c, c}),
                 b->Seq({b->Byte(0xf4), range(0x80, 0x8f), c, c})});
}

}  // namespace kvserve
