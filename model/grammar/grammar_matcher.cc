#include "model/grammar/grammar_matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace kvserve {

CompiledGrammar::CompiledGrammar(GrammarNfa nfa, std::shared_ptr<const TokenVocab> vocab)
    : nfa_(std::move(nfa)), vocab_(std::move(vocab)) {
  // Byte classes: bytes that every byte set of the NFA either holds or not
  // step every state set alike, so a DFA successor is computed once per
  // class (one class for all the letters inside a JSON string).
  byte_class_.fill(0);
  int32_t classes = 1;
  for (const ByteSet& set : nfa_.bytesets) {
    std::array<int32_t, 512> split;
    split.fill(-1);
    int32_t next = 0;
    for (int b = 0; b < 256; ++b) {
      int32_t& c = split[2 * byte_class_[b] + set.Has(static_cast<uint8_t>(b))];
      if (c < 0) c = next++;
      byte_class_[b] = static_cast<uint8_t>(c);
    }
    classes = next;
    if (classes == 256) break;
  }
  class_bytes_.resize(classes);
  for (int b = 0; b < 256; ++b) class_bytes_[byte_class_[b]].push_back(static_cast<uint8_t>(b));
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
    const bool local = stack == kCutStack || (stack >= 0 && frames_[stack].local);
    frames_.push_back(Frame{ret, stack, depth, local});
  }
  return it->second;
}

void CompiledGrammar::Close(GrammarStateSet* out) const {
  out->threads.clear();
  out->can_end = false;
  out->escaped = false;
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
      if (t.stack == -1) {
        out->can_end = true;
      } else if (t.stack == kCutStack) {
        out->escaped = true;
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
        if (t.stack >= 0 && frames_[t.stack].local && frames_[t.stack].depth >= kLocalDepth) {
          out->escaped = true;  // the whole stack decides whether it is too deep
          continue;
        }
        if (t.stack >= 0 && frames_[t.stack].depth >= kMaxStackDepth) continue;
        seeds_.push_back(GrammarThread{nfa_.rule_start[e.call], Push(t.stack, e.target)});
      } else {
        seeds_.push_back(GrammarThread{e.target, t.stack});
      }
    }
  }
  std::sort(out->threads.begin(), out->threads.end());
  if (out->escaped) out->first = ByteSet{}.Complement();
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
  if (in.escaped) {
    out->escaped = true;
    out->first = ByteSet{}.Complement();
  }
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

void CompiledGrammar::KeyInto(const GrammarStateSet& set, std::vector<uint64_t>* key) {
  key->clear();
  key->push_back(static_cast<uint64_t>(set.can_end) | static_cast<uint64_t>(set.escaped) << 1);
  for (const GrammarThread& t : set.threads) {
    key->push_back((static_cast<uint64_t>(static_cast<uint32_t>(t.state)) << 32) |
                   static_cast<uint32_t>(t.stack));
  }
}

std::vector<uint64_t> CompiledGrammar::Key(const GrammarStateSet& set) {
  std::vector<uint64_t> key;
  key.reserve(set.threads.size() + 1);
  KeyInto(set, &key);
  return key;
}

int32_t CompiledGrammar::Intern(const GrammarStateSet& set) const {
  KeyInto(set, &key_scratch_);
  if (auto it = dfa_ids_.find(key_scratch_); it != dfa_ids_.end()) return it->second;
  auto [it, inserted] = dfa_ids_.try_emplace(key_scratch_, static_cast<int32_t>(dfa_sets_.size()));
  if (inserted) {
    dfa_sets_.push_back(set);
    dfa_escaped_.push_back(set.escaped);
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
  // The byte sets this state's threads read: bytes that each of them holds
  // or not alike step the state alike, so one Step serves every such byte
  // class (inside a JSON string: all ASCII letters, which the grammar's
  // literals split into many global classes).
  state_bytesets_.clear();
  for (const GrammarThread& t : dfa_sets_[id].threads) {
    for (const GrammarNfa::Edge& e : nfa_.states[t.state].edges) {
      if (e.byteset >= 0 && std::find(state_bytesets_.begin(), state_bytesets_.end(), e.byteset) ==
                                state_bytesets_.end()) {
        state_bytesets_.push_back(e.byteset);
      }
    }
  }
  Step(dfa_sets_[id], byte, &step_out_);
  next = step_out_.dead() ? -1 : Intern(step_out_);
  std::array<int32_t, 256>& row = dfa_next_[id];
  for (const std::vector<uint8_t>& bytes : class_bytes_) {
    const uint8_t b = bytes[0];
    if (row[b] != kUnknown) continue;
    bool alike = true;
    for (int32_t set : state_bytesets_) {
      if (nfa_.bytesets[set].Has(b) != nfa_.bytesets[set].Has(byte)) {
        alike = false;
        break;
      }
    }
    if (alike) {
      for (uint8_t c : bytes) row[c] = next;
    }
  }
  return next;
}

void CompiledGrammar::ClearDfa() const {
  dfa_sets_.clear();
  dfa_escaped_.clear();
  dfa_ids_.clear();
  dfa_next_.clear();
}

int32_t CompiledGrammar::WalkTrie(const GrammarStateSet& in, int32_t min_bytes,
                                  std::span<uint32_t> mask, std::vector<int32_t>* escaped) const {
  const TokenVocab::Node* nodes = vocab_->nodes().data();
  const size_t num_nodes = vocab_->nodes().size();
  const int32_t* token_ids = vocab_->token_ids().data();
  uint32_t* words = mask.data();
  if (min_bytes == 0) std::memset(words, 0, mask.size() * sizeof(uint32_t));
  if (dfa_sets_.size() >= kMaxDfaStates) ClearDfa();
  depth_ids_.resize(vocab_->max_token_bytes() + 1);
  int32_t* level = depth_ids_.data();
  level[0] = Intern(in);
  int32_t count = 0;
  size_t i = 0;
  while (i < num_nodes) {
    const TokenVocab::Node& n = nodes[i];
    if (n.max_depth <= min_bytes) {
      i = n.subtree_end;
      continue;
    }
    const int32_t from = level[n.depth - 1];
    int32_t next = dfa_next_[from][n.byte];
    if (next == kUnknown) next = Next(from, n.byte);
    if (next < 0) {
      i = n.subtree_end;
      continue;
    }
    level[n.depth] = next;
    if (n.depth > min_bytes) {
      const int32_t* ids = token_ids + n.first_token;
      if (dfa_escaped_[next]) {
        escaped->insert(escaped->end(), ids, ids + n.num_tokens);
      } else {
        for (int32_t k = 0; k < n.num_tokens; ++k) {
          words[ids[k] >> 5] |= uint32_t{1} << (ids[k] & 31);
        }
        count += n.num_tokens;
      }
    }
    ++i;
  }
  return count;
}

void CompiledGrammar::WalkLongTokens(const GrammarStateSet& in, int32_t min_bytes,
                                     std::span<uint32_t> mask,
                                     std::vector<int32_t>* escaped) const {
  const TokenVocab::LongTokens* list = vocab_->long_tokens(min_bytes);
  if (list == nullptr) {
    WalkTrie(in, min_bytes, mask, escaped);
    return;
  }
  if (dfa_sets_.size() >= kMaxDfaStates) ClearDfa();
  depth_ids_.resize(vocab_->max_token_bytes() + 1);
  int32_t* ids = depth_ids_.data();
  ids[0] = Intern(in);
  // alive: the longest prefix of the last entry that `in` accepts; an entry
  // sharing more than that with it shares a rejected prefix.
  int32_t alive = 0;
  const char* bytes = list->bytes.data();
  uint32_t* words = mask.data();
  for (const TokenVocab::LongTokens::Entry& e : list->entries) {
    if (e.lcp > alive) continue;
    int32_t depth = e.lcp;
    const char* b = bytes + e.suffix;
    for (; depth < e.len; ++depth, ++b) {
      const uint8_t byte = static_cast<uint8_t>(*b);
      int32_t next = dfa_next_[ids[depth]][byte];
      if (next == kUnknown) next = Next(ids[depth], byte);
      if (next < 0) break;
      ids[depth + 1] = next;
    }
    alive = depth;
    if (depth == e.len && e.len > min_bytes) {
      if (dfa_escaped_[ids[depth]]) {
        escaped->push_back(e.id);
      } else {
        words[e.id >> 5] |= uint32_t{1} << (e.id & 31);
      }
    }
  }
}

int32_t CompiledGrammar::CanonicalState(int32_t state, int32_t bytes) const {
  // Copy c of a repeat with n copies, `min` of them mandatory, has n - 1 - c
  // copies after it and max(0, min - 1 - c) mandatory ones. Within `bytes`
  // bytes a path from anywhere in copy c enters at most bytes + 1 more
  // copies (each consumes a byte), so copies with at least bytes + 1 after
  // them and either no mandatory one left or at least bytes + 1 of them
  // read the same: each class moves to its copy nearest the end.
  for (int32_t r = nfa_.state_repeat[state]; r >= 0;) {
    const GrammarNfa::RepeatCopies& rep = nfa_.repeats[r];
    const int32_t n = static_cast<int32_t>(rep.entry.size());
    const int32_t c = static_cast<int32_t>(
        std::upper_bound(rep.entry.begin(), rep.entry.end(), state) - rep.entry.begin() - 1);
    int32_t to = c;
    if (c <= rep.min - 2 - bytes) {
      to = rep.min - 2 - bytes;
    } else if (c >= rep.min - 1 && c <= n - 2 - bytes) {
      to = n - 2 - bytes;
    }
    state += rep.entry[to] - rep.entry[c];
    r = rep.parent;
  }
  return state;
}

int32_t CompiledGrammar::CanonicalStack(int32_t stack, int32_t level, int32_t bytes) const {
  if (stack < 0) return stack;
  const uint64_t key = (static_cast<uint64_t>(level) << 32) | static_cast<uint32_t>(stack);
  if (auto it = canonical_stacks_.find(key); it != canonical_stacks_.end()) return it->second;
  const Frame f = frames_[stack];
  const int32_t parent = CanonicalStack(f.parent, level, bytes);
  const int32_t ret = CanonicalState(f.ret, bytes);
  const int32_t canonical = parent == f.parent && ret == f.ret ? stack : Push(parent, ret);
  canonical_stacks_[key] = canonical;
  return canonical;
}

std::vector<uint64_t> CompiledGrammar::CanonicalKey(const GrammarStateSet& set, int32_t level,
                                                    int32_t bytes) const {
  canonical_threads_.clear();
  for (const GrammarThread& t : set.threads) {
    canonical_threads_.push_back(
        GrammarThread{CanonicalState(t.state, bytes), CanonicalStack(t.stack, level, bytes)});
  }
  std::sort(canonical_threads_.begin(), canonical_threads_.end());
  canonical_threads_.erase(std::unique(canonical_threads_.begin(), canonical_threads_.end()),
                           canonical_threads_.end());
  std::vector<uint64_t> key;
  key.reserve(canonical_threads_.size() + 1);
  key.push_back(static_cast<uint64_t>(level));
  for (const GrammarThread& t : canonical_threads_) {
    key.push_back((static_cast<uint64_t>(static_cast<uint32_t>(t.state)) << 32) |
                  static_cast<uint32_t>(t.stack));
  }
  return key;
}

void CompiledGrammar::ClearMasks() const {
  cached_.clear();
  masks_.clear();
  canonical_.clear();
  canonical_stacks_.clear();
}

bool CompiledGrammar::Localize(const GrammarStateSet& in, GrammarStateSet* out) const {
  out->threads.clear();
  out->can_end = false;
  out->escaped = false;
  out->first = in.first;
  bool cut = false;
  for (const GrammarThread& t : in.threads) {
    // Down the stack to the frame that called the innermost shared rule.
    rets_.clear();
    int32_t rule = nfa_.state_rule[t.state], stack = t.stack;
    while (stack >= 0 && !nfa_.rule_shared[rule] &&
           static_cast<int32_t>(rets_.size()) < kLocalDepth) {
      rets_.push_back(frames_[stack].ret);
      rule = nfa_.state_rule[frames_[stack].ret];
      stack = frames_[stack].parent;
    }
    if (stack < 0 || !nfa_.rule_shared[rule] ||
        frames_[stack].depth > kMaxStackDepth - kLocalDepth) {
      out->threads.push_back(t);
      continue;
    }
    int32_t local = kCutStack;
    for (size_t k = rets_.size(); k-- > 0;) local = Push(local, rets_[k]);
    out->threads.push_back(GrammarThread{t.state, local});
    cut = true;
  }
  std::sort(out->threads.begin(), out->threads.end());
  out->threads.erase(std::unique(out->threads.begin(), out->threads.end()), out->threads.end());
  return cut;
}

int32_t CompiledGrammar::MaskIndex(const GrammarStateSet& in) const {
  std::vector<uint64_t> key = Key(in);
  if (auto it = masks_.find(key); it != masks_.end()) {
    ++hits_;
    return it->second;
  }
  // Canonical keys only for sets with a thread or return state in a copy.
  bool in_copy = false;
  for (const GrammarThread& t : in.threads) {
    for (int32_t st = t.stack; !in_copy && st >= 0; st = frames_[st].parent) {
      in_copy = nfa_.state_repeat[frames_[st].ret] >= 0;
    }
    in_copy = in_copy || nfa_.state_repeat[t.state] >= 0;
    if (in_copy) break;
  }
  const std::vector<int32_t>& levels = vocab_->levels();
  level_keys_.clear();
  int32_t base = -1;
  size_t base_level = 0;
  if (in_copy) {
    for (size_t l = levels.size(); l-- > 0;) {
      level_keys_.push_back(CanonicalKey(in, static_cast<int32_t>(l), levels[l]));
      if (base < 0) {
        if (auto it = canonical_.find(level_keys_.back()); it != canonical_.end()) {
          base = it->second;
          base_level = l;
        }
      }
    }
  }
  const int32_t index = static_cast<int32_t>(cached_.size());
  cached_.emplace_back();
  CachedMask& c = cached_.back();
  c.words.resize(vocab_->mask_words());
  std::span<uint32_t> mask(c.words);
  if (base >= 0 && base_level + 1 == levels.size()) {
    ++hits_;  // the same tokens of every length
    c = cached_[base];
  } else if (base >= 0) {
    ++walks_;
    // Tokens of at most levels[base_level] bytes from the related set (an
    // escape too: it leaves the copies, which no such token does from
    // either set), the longer ones walked.
    const uint32_t* from = cached_[base].words.data();
    const uint32_t* keep = vocab_->short_mask(base_level).data();
    for (size_t w = 0; w < mask.size(); ++w) mask[w] = from[w] & keep[w];
    for (int32_t id : cached_[base].escaped) {
      if (static_cast<int32_t>(vocab_->bytes(id).size()) <= levels[base_level]) {
        c.escaped.push_back(id);
      }
    }
    WalkLongTokens(in, levels[base_level], mask, &c.escaped);
    c.count = 0;
    for (uint32_t w : mask) c.count += std::popcount(w);
  } else {
    ++walks_;
    ++full_walks_;
    c.count = WalkTrie(in, 0, mask, &c.escaped);
  }
  std::sort(c.escaped.begin(), c.escaped.end());
  masks_.emplace(std::move(key), index);
  for (std::vector<uint64_t>& k : level_keys_) canonical_.try_emplace(std::move(k), index);
  return index;
}

bool CompiledGrammar::Accepts(int32_t id, const std::string& bytes) const {
  for (char ch : bytes) {
    const uint8_t b = static_cast<uint8_t>(ch);
    int32_t next = dfa_next_[id][b];
    if (next == kUnknown) next = Next(id, b);
    if (next < 0) return false;
    id = next;
  }
  return true;
}

int32_t CompiledGrammar::FillMask(const GrammarStateSet& in, std::span<uint32_t> mask) const {
  absl::MutexLock lock(&mu_);
  if (auto it = masks_.find(Key(in)); it != masks_.end()) {
    ++hits_;
    const CachedMask& c = cached_[it->second];
    std::memcpy(mask.data(), c.words.data(), mask.size() * sizeof(uint32_t));
    return c.count;
  }
  // Room for the cut set's mask and this one's.
  if (cached_.size() + 2 > kMaxCachedMasks) ClearMasks();
  if (!Localize(in, &local_)) {
    const CachedMask& c = cached_[MaskIndex(in)];
    std::memcpy(mask.data(), c.words.data(), mask.size() * sizeof(uint32_t));
    return c.count;
  }
  // The tokens the cut set accepts without escaping are accepted here too
  // (their paths stay above the cut, where both sets' threads agree), those
  // it rejects without escaping are rejected; only the escaping ones are
  // stepped through this set.
  ++cut_masks_;
  const int32_t local = MaskIndex(local_);
  CachedMask c = cached_[local];
  if (!c.escaped.empty()) {
    if (dfa_sets_.size() >= kMaxDfaStates) ClearDfa();
    const int32_t start = Intern(in);
    for (int32_t id : c.escaped) {
      if (Accepts(start, vocab_->bytes(id))) {
        c.words[id >> 5] |= uint32_t{1} << (id & 31);
        ++c.count;
      }
    }
    c.escaped.clear();
  }
  std::memcpy(mask.data(), c.words.data(), mask.size() * sizeof(uint32_t));
  masks_.emplace(Key(in), static_cast<int32_t>(cached_.size()));
  const int32_t count = c.count;
  cached_.push_back(std::move(c));
  return count;
}

int64_t CompiledGrammar::walks() const {
  absl::MutexLock lock(&mu_);
  return walks_;
}

int64_t CompiledGrammar::full_walks() const {
  absl::MutexLock lock(&mu_);
  return full_walks_;
}

int64_t CompiledGrammar::cut_masks() const {
  absl::MutexLock lock(&mu_);
  return cut_masks_;
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
