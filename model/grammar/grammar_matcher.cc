#include "model/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>

namespace kvserve {

CompiledGrammar::CompiledGrammar(GrammarNfa nfa, std::shared_ptr<const TokenVocab> vocab)
    : nfa_(std::move(nfa)), vocab_(std::move(vocab)) {
  absl::MutexLock lock(&mu_);
  stamp_.assign(nfa_.states.size(), 0);
  seeds_.push_back(GrammarThread{nfa_.rule_start[nfa_.start_rule], -1});
  Close(&initial_);
}

int32_t CompiledGrammar::Push(int32_t stack, int32_t ret) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(stack)) << 32) | static_cast<uint32_t>(ret);
  auto [it, inserted] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (inserted) {
    const int32_t depth = stack < 0 ? 1 : frames_[stack].depth + 1;
    frames_.push_back(Frame{ret, stack, depth});
  }
  return it->second;
}

void CompiledGrammar::Close(GrammarStateSet* out) const {
  out->threads.clear();
  out->can_end = false;
  out->first = ByteSet{};
  visited_.clear();
  if (++generation_ == 0) {
    std::fill(stamp_.begin(), stamp_.end(), 0);
    generation_ = 1;
  }
  while (!seeds_.empty()) {
    const GrammarThread t = seeds_.back();
    seeds_.pop_back();
    if (stamp_[t.state] == generation_) {
      if (std::find(visited_.begin(), visited_.end(), t) != visited_.end()) continue;
    }
    stamp_[t.state] = generation_;
    visited_.push_back(t);
    const GrammarNfa::State& st = nfa_.states[t.state];
    if (st.rule_end >= 0) {
      if (t.stack < 0) {
        out->can_end = true;
      } else {
        const Frame& f = frames_[t.stack];
        seeds_.push_back(GrammarThread{f.ret, f.parent});
      }
      continue;
    }
    if (st.consumes) {
      out->threads.push_back(t);
      for (const GrammarNfa::Edge& e : st.edges) {
        if (e.byteset >= 0) out->first.Or(nfa_.bytesets[e.byteset]);
      }
    }
    for (const GrammarNfa::Edge& e : st.edges) {
      if (e.byteset >= 0) continue;
      if (e.call >= 0) {
        if (t.stack >= 0 && frames_[t.stack].depth >= kMaxStackDepth) continue;
        seeds_.push_back(GrammarThread{nfa_.rule_start[e.call], Push(t.stack, e.target)});
      } else {
        seeds_.push_back(GrammarThread{e.target, t.stack});
      }
    }
  }
  std::sort(out->threads.begin(), out->threads.end());
}

void CompiledGrammar::Step(const GrammarStateSet& in, uint8_t byte, GrammarStateSet* out) const {
  seeds_.clear();
  for (const GrammarThread& t : in.threads) {
    for (const GrammarNfa::Edge& e : nfa_.states[t.state].edges) {
      if (e.byteset >= 0 && nfa_.bytesets[e.byteset].Has(byte)) {
        seeds_.push_back(GrammarThread{e.target, t.stack});
      }
    }
  }
  Close(out);
}

bool CompiledGrammar::Advance(const GrammarStateSet& in, std::string_view bytes,
                              GrammarStateSet* out) const {
  absl::MutexLock lock(&mu_);
  GrammarStateSet cur = in, next;
  for (char c : bytes) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (!cur.first.Has(b)) return false;
    Step(cur, b, &next);
    if (next.dead()) return false;
    std::swap(cur, next);
  }
  *out = std::move(cur);
  return true;
}

std::vector<uint64_t> CompiledGrammar::Key(const GrammarStateSet& set) {
  std::vector<uint64_t> key;
  key.reserve(set.threads.size() + 1);
  key.push_back(set.can_end);
  for (const GrammarThread& t : set.threads) {
    key.push_back((static_cast<uint64_t>(static_cast<uint32_t>(t.state)) << 32) |
                  static_cast<uint32_t>(t.stack));
  }
  return key;
}

int32_t CompiledGrammar::Intern(const GrammarStateSet& set) const {
  auto [it, inserted] = dfa_ids_.try_emplace(Key(set), static_cast<int32_t>(dfa_sets_.size()));
  if (inserted) {
    dfa_sets_.push_back(set);
    dfa_next_.emplace_back();
    dfa_next_.back().fill(kUnknown);

    for (int b = 0; b < 256; ++b) {
      if (!set.first.Has(static_cast<uint8_t>(b))) dfa_next_.back()[b] = -1;
    }
  }
  return it->second;
}

int32_t CompiledGrammar::Next(int32_t id, uint8_t byte) const {
  int32_t next = dfa_next_[id][byte];
  if (next != kUnknown) return next;
  Step(dfa_sets_[id], byte, &step_out_);
  next = step_out_.dead() ? -1 : Intern(step_out_);
  dfa_next_[id][byte] = next;
  return next;
}

int32_t CompiledGrammar::WalkTrie(const GrammarStateSet& in, std::span<uint32_t> mask) const {
  const std::vector<TokenVocab::Node>& nodes = vocab_->nodes();
  std::memset(mask.data(), 0, mask.size() * sizeof(uint32_t));
  if (dfa_sets_.size() >= kMaxDfaStates) {
    dfa_sets_.clear();
    dfa_ids_.clear();
    dfa_next_.clear();
  }
  if (levels_.empty()) levels_.resize(2);
  levels_[0] = Intern(in);
  int32_t count = 0;
  size_t i = 0;
  while (i < nodes.size()) {
    const TokenVocab::Node& n = nodes[i];
    const int32_t from = levels_[n.depth - 1];
    const int32_t next = Next(from, n.byte);
    if (next < 0) {
      i = n.subtree_end;
      continue;
    }
    if (levels_.size() <= static_cast<size_t>(n.depth)) levels_.resize(n.depth + 1);
    levels_[n.depth] = next;
    const int32_t* ids = vocab_->node_tokens(n);
    for (int32_t k = 0; k < n.num_tokens; ++k) {
      mask[ids[k] >> 5] |= uint32_t{1} << (ids[k] & 31);
    }
    count += n.num_tokens;
    ++i;
  }
  return count;
}

int32_t CompiledGrammar::FillMask(const GrammarStateSet& in, std::span<uint32_t> mask) const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> key = Key(in);
  if (auto it = masks_.find(key); it != masks_.end()) {
    ++hits_;
    std::memcpy(mask.data(), it->second.words.data(), mask.size() * sizeof(uint32_t));
    return it->second.count;
  }
  ++walks_;
  const int32_t count = WalkTrie(in, mask);
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  CachedMask& c = masks_[std::move(key)];
  c.words.assign(mask.begin(), mask.end());
  c.count = count;
  return count;
}

int64_t CompiledGrammar::walks() const {
  absl::MutexLock lock(&mu_);
  return walks_;
}

int64_t CompiledGrammar::cache_hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->initial()) {}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  return grammar_->Advance(state_, bytes, &state_);
}

}  // namespace kvserve
