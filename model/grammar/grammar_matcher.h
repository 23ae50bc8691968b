// CompiledGrammar and GrammarMatcher: a grammar (model/grammar/grammar.h)
// run over bytes, and the allowed-token mask of a state over a TokenVocab.
//
// A matcher's state is a set of threads (NFA state, call stack), closed over
// epsilon, call and return edges, so only threads about to read a byte remain,
// plus whether the grammar may end here. Call stacks are interned in the
// compiled grammar (frame = return state + parent frame), so a thread is two
// ints and a state is a short sorted vector that hashes well.
//
// FillMask walks the vocabulary trie depth-first, stepping the state by each
// node's byte and skipping a subtree as soon as its prefix is rejected. The
// steps go through a DFA over state sets built lazily in the compiled grammar
// (set -> id, (id, byte class) -> id), so after the first walks a trie node
// costs one table lookup. Masks are bitsets, one bit per token id in 32-bit
// words (bit id % 32 of word id / 32), the layout a sampling kernel can read
// per row.
//
// Masks are cached in the compiled grammar under the exact thread set, and
// under its canonical key at each length level d of the vocabulary
// (TokenVocab::levels): every thread state and call-stack return state that
// lies in a copy of a bounded repeat (GrammarNfa::repeats) with at least
// d + 1 copies after it, and either no mandatory copy left or d + 1 of them,
// moves to the copy nearest the end with the same property. Two sets with
// one canonical key at level d accept the same byte strings of up to d bytes:
// a copy consumes at least one byte, so no such string reaches the end of
// the copies or, where there was none, an exit, and a token is accepted when
// one thread's paths accept it, each thread's paths mapping copy for copy. A
// set met for the first time takes the tokens of at most d bytes from a
// cached set with its canonical key at the largest level d and walks only
// the longer ones (TokenVocab::long_tokens; inside a string of maxLength 24
// with 19 characters left, the 1,591 of Llama 3's 128,256 longer than 15
// bytes). At the last level (the longest token) the cached mask is the
// mask.
//
// Shared rules (a JSON schema's strings, one rule per length range): a set
// with a thread inside one is cut (Localize): each such thread's stack keeps
// only the frames above the innermost shared rule's caller, on kCutStack, so
// every field of one range gives one cut set at one position. The cut set's
// mask is cached as above, and a walk that returns below the cut marks its
// state escaped (and, sticky, every state after it): its tokens go to a list
// apart. The set's mask is the cut set's plus those of the listed tokens
// that the whole set accepts, stepped one by one through the DFA (for a
// string, only tokens that hold a closing quote: 1,345 of Llama 3's). Exact:
// a path that never escapes only pushes and pops frames above the cut,
// where the cut threads and the whole ones agree frame for frame, so a token
// the cut set accepts unescaped is accepted, and one it rejects with no
// escape on the way is rejected; the stack-depth guard agrees because a cut
// set escapes instead of pushing its kLocalDepth-th frame, and only stacks
// at most kMaxStackDepth - kLocalDepth deep are cut.
//
// The cache holds at most kMaxCachedMasks masks and their keys (16 MiB at
// 128k tokens) with their escaped lists (a JSON string's: the tokens with a
// quote, 5.4 KiB at Llama 3), the DFA kMaxDfaStates sets; each is cleared
// when it fills.
//
// End tokens (EOS, stop ids) are not the grammar's: the caller allows them
// when CanEnd().
//
// Thread-safety: a CompiledGrammar is shared by the requests that use the same
// grammar; its stack table, mask cache and scratch are guarded by one mutex,
// taken once per AcceptBytes / FillMask. A GrammarMatcher is a value owned by
// one sequence (copy it to fork).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "model/grammar/grammar.h"
#include "model/grammar/token_vocab.h"

namespace kvserve {

struct GrammarThread {
  int32_t state = 0;
  int32_t stack = -1;  // interned frame id; -1 empty
  bool operator==(const GrammarThread& o) const { return state == o.state && stack == o.stack; }
  bool operator<(const GrammarThread& o) const {
    return state != o.state ? state < o.state : stack < o.stack;
  }
};

struct GrammarStateSet {
  std::vector<GrammarThread> threads;  // sorted, unique, each about to read
  bool can_end = false;
  // Only in a set cut from its callers (CompiledGrammar::Localize): some
  // thread returned below the cut, so any byte may follow (sticky).
  bool escaped = false;
  ByteSet first;  // the bytes some thread reads (all of them once escaped)
  bool dead() const { return threads.empty() && !can_end && !escaped; }
};

class CompiledGrammar {
 public:
  // A call stack deeper than this drops the thread (left recursion guard).
  static constexpr int32_t kMaxStackDepth = 512;
  // Cached masks per grammar (each mask_words() words, plus a canonical key
  // per length level); the cache is cleared when it fills.
  static constexpr size_t kMaxCachedMasks = 1024;

  CompiledGrammar(GrammarNfa nfa, std::shared_ptr<const TokenVocab> vocab);

  const TokenVocab& vocab() const { return *vocab_; }
  int32_t num_states() const { return static_cast<int32_t>(nfa_.states.size()); }
  const GrammarStateSet& initial() const { return initial_; }

  // The state after `bytes`; false (out untouched) if some byte is rejected.
  bool Advance(const GrammarStateSet& in, std::string_view bytes, GrammarStateSet* out) const;
  // Mask of the tokens whose bytes `in` accepts; returns how many.
  int32_t FillMask(const GrammarStateSet& in, std::span<uint32_t> mask) const;
  // Masks computed by a trie walk (whole or over the long tokens only),
  // those of them that walked the whole trie, and masks served from the
  // cache (by the exact set or its canonical key at the last level).
  int64_t walks() const;
  int64_t full_walks() const;
  int64_t cache_hits() const;
  // Masks put together from a cut set's mask (see Localize) and a step of
  // the tokens that escape it.
  int64_t cut_masks() const;

 private:
  struct Frame {
    int32_t ret = 0, parent = -1, depth = 0;
    bool local = false;  // above a cut (kCutStack at the bottom)
  };
  // The bottom of a stack cut from its callers, and the most frames a cut
  // set pushes above it before it counts as escaped (so that a cut set's
  // threads never meet the kMaxStackDepth guard where the whole stack
  // would: cuts are made only at depths up to kMaxStackDepth - kLocalDepth).
  static constexpr int32_t kCutStack = -2;
  static constexpr int32_t kLocalDepth = 64;
  // The set with each thread's stack cut below its innermost shared rule
  // (GrammarNfa::rule_shared; can_end dropped); false when no thread was cut.
  bool Localize(const GrammarStateSet& in, GrammarStateSet* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The index in cached_ of set's mask: by its exact key, or computed from
  // a cached set with its canonical key and a walk, or by a whole walk.
  int32_t MaskIndex(const GrammarStateSet& set) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the token's bytes step DFA state `id` to a live one.
  bool Accepts(int32_t id, const std::string& bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearDfa() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Step(const GrammarStateSet& in, uint8_t byte, GrammarStateSet* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes seeds_ into out (consuming threads, can_end, first bytes).
  void Close(GrammarStateSet* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t Push(int32_t stack, int32_t ret) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the bits of the tokens longer than `min_bytes` that `in` accepts
  // (all of them for 0, after clearing the mask) and returns how many; a
  // token whose walk escapes (cut sets only) goes to `escaped` instead.
  int32_t WalkTrie(const GrammarStateSet& in, int32_t min_bytes, std::span<uint32_t> mask,
                   std::vector<int32_t>* escaped) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for min_bytes > 0 through the vocabulary's front-coded list of
  // long tokens (TokenVocab::long_tokens), without a count.
  void WalkLongTokens(const GrammarStateSet& in, int32_t min_bytes, std::span<uint32_t> mask,
                      std::vector<int32_t>* escaped) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The key of `set` with its repeat copies moved as for level `bytes`
  // (first word: the level); empty when no thread is in a repeat copy.
  std::vector<uint64_t> CanonicalKey(const GrammarStateSet& set, int32_t level, int32_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t CanonicalState(int32_t state, int32_t bytes) const;
  int32_t CanonicalStack(int32_t stack, int32_t level, int32_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearMasks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lazily built DFA over state sets: Intern gives a set its id, Next
  // the id after a byte (-1: dead), computed once and remembered.
  int32_t Intern(const GrammarStateSet& set) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t Next(int32_t id, uint8_t byte) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::vector<uint64_t> Key(const GrammarStateSet& set);
  static void KeyInto(const GrammarStateSet& set, std::vector<uint64_t>* key);

  const GrammarNfa nfa_;
  const std::shared_ptr<const TokenVocab> vocab_;
  GrammarStateSet initial_;
  // The byte classes of nfa_'s byte sets: byte -> class, class -> bytes.
  std::array<uint8_t, 256> byte_class_{};
  std::vector<std::vector<uint8_t>> class_bytes_;

  mutable absl::Mutex mu_;
  mutable std::vector<Frame> frames_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<uint64_t, int32_t> frame_ids_ ABSL_GUARDED_BY(mu_);
  struct CachedMask {
    std::vector<uint32_t> words;
    int32_t count = 0;
    // Cut sets: the tokens whose walk escapes (not in words), ascending.
    std::vector<int32_t> escaped;
  };
  mutable std::vector<CachedMask> cached_ ABSL_GUARDED_BY(mu_);
  // Exact keys and canonical keys -> index into cached_.
  mutable absl::flat_hash_map<std::vector<uint64_t>, int32_t> masks_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::vector<uint64_t>, int32_t> canonical_ ABSL_GUARDED_BY(mu_);
  // (level, stack) -> the canonical stack at that level.
  mutable absl::flat_hash_map<uint64_t, int32_t> canonical_stacks_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::vector<uint64_t>> level_keys_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<GrammarThread> canonical_threads_ ABSL_GUARDED_BY(mu_);
  mutable int64_t walks_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int64_t full_walks_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int64_t cut_masks_ ABSL_GUARDED_BY(mu_) = 0;
  // Scratch.
  mutable std::vector<GrammarThread> seeds_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<GrammarThread> visited_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<uint32_t> stamp_ ABSL_GUARDED_BY(mu_);
  mutable uint32_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::vector<int32_t> depth_ids_ ABSL_GUARDED_BY(mu_);
  mutable GrammarStateSet step_out_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<int32_t> state_bytesets_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<uint64_t> key_scratch_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<int32_t> rets_ ABSL_GUARDED_BY(mu_);
  mutable GrammarStateSet local_ ABSL_GUARDED_BY(mu_);
  // The DFA: sets by id, their ids by key, and 256 successors per id
  // (kUnknown until computed). Cleared when it reaches kMaxDfaStates.
  static constexpr int32_t kUnknown = -2;
  static constexpr size_t kMaxDfaStates = 1 << 15;
  mutable std::vector<GrammarStateSet> dfa_sets_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<uint8_t> dfa_escaped_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::vector<uint64_t>, int32_t> dfa_ids_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::array<int32_t, 256>> dfa_next_ ABSL_GUARDED_BY(mu_);
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Consumes bytes; false (state unchanged) when the grammar rejects them.
  bool AcceptBytes(std::string_view bytes);
  // The grammar may end here (allow EOS).
  bool CanEnd() const { return state_.can_end; }
  // Only the end is left: no byte is accepted any more.
  bool MustEnd() const { return state_.threads.empty(); }
  // Fills mask (vocab().mask_words() words) with the allowed tokens; returns
  // how many (end tokens not counted: add them when CanEnd()).
  int32_t FillMask(std::span<uint32_t> mask) const { return grammar_->FillMask(state_, mask); }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  GrammarStateSet state_;
};

}  // namespace kvserve
