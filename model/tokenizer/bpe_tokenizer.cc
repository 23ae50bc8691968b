#include "model/tokenizer/bpe_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <deque>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace kvserve {
namespace {

// The code point at s[*i] (advancing *i), or -1 for an invalid byte.
int32_t NextCodePoint(std::string_view s, size_t* i) {
  utf8proc_int32_t cp = -1;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const uint8_t*>(s.data()) + *i,
                                              static_cast<utf8proc_ssize_t>(s.size() - *i), &cp);
  *i += n > 0 ? static_cast<size_t>(n) : 1;
  return n > 0 ? cp : -1;
}

// Unicode White_Space, which Rust's char::is_whitespace (what HF tokenizers'
// lstrip/rstrip use) tests.
bool IsWhiteSpace(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string_view TrimTrailingWhiteSpace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
    size_t i = begin;
    if (!IsWhiteSpace(NextCodePoint(s, &i)) || i != end) break;
    end = begin;
  }
  return s.substr(0, end);
}

size_t SkipWhiteSpace(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t i = pos;
    if (!IsWhiteSpace(NextCodePoint(s, &i))) break;
    pos = i;
  }
  return pos;
}

// Debian's Abseil has its own string_view; heterogeneous lookups take it.
absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// NFC of s; s unchanged when it is not valid UTF-8 (HF would have refused
// such input; here its valid parts still encode, byte by byte).
std::string Nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeTokenizerSpec spec)
    : added_(std::move(spec.added_tokens)),
      nfc_(spec.nfc),
      pre_tokenizer_(std::move(spec.pre_tokenizer)),
      ignore_merges_(spec.ignore_merges),
      bos_id_(spec.bos_id),
      eos_id_(spec.eos_id),
      add_bos_(spec.add_bos),
      cache_(new CacheShard[kCacheShards]) {
  int32_t size = 0;
  for (const auto& t : spec.vocab) size = std::max(size, t.id + 1);
  for (const auto& t : added_) size = std::max(size, t.id + 1);
  bytes_.resize(size);
  pieces_.resize(size);

  byte_id_.fill(-1);
  id_of_bytes_.reserve(spec.vocab.size());
  for (auto& t : spec.vocab) {
    if (t.bytes.size() == 1) byte_id_[static_cast<unsigned char>(t.bytes[0])] = t.id;
    id_of_bytes_.emplace(t.bytes, t.id);
    bytes_[t.id] = std::move(t.bytes);
    pieces_[t.id] = std::move(t.piece);
  }
  merges_.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& m = spec.merges[r];
    // A repeated pair takes its last rank, as in HF tokenizers' map build.
    merges_.insert_or_assign(PairKey(m.left, m.right),
                             MergeRule{static_cast<uint32_t>(r), m.merged});
  }

  for (size_t i = 0; i < added_.size(); ++i) {
    const auto& t = added_[i];
    if (t.content.empty()) continue;
    added_index_.emplace(t.content, static_cast<int>(i));
    added_first_byte_[static_cast<unsigned char>(t.content[0])] = true;
    added_lengths_.push_back(t.content.size());
    bytes_[t.id] = t.special ? std::string() : t.content;
    pieces_[t.id] = t.content;
  }
  std::sort(added_lengths_.begin(), added_lengths_.end(), std::greater<>());
  added_lengths_.erase(std::unique(added_lengths_.begin(), added_lengths_.end()),
                       added_lengths_.end());
}

const BpeTokenizerSpec::AddedToken* BpeTokenizer::MatchAddedToken(std::string_view text,
                                                                  size_t pos) const {
  if (!added_first_byte_[static_cast<unsigned char>(text[pos])]) return nullptr;
  for (size_t len : added_lengths_) {
    if (len > text.size() - pos) continue;
    auto it = added_index_.find(Key(text.substr(pos, len)));
    if (it != added_index_.end()) return &added_[it->second];
  }
  return nullptr;
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  size_t section = 0;  // start of the text before the next added token
  size_t pos = 0;
  while (pos < text.size()) {
    const BpeTokenizerSpec::AddedToken* t = MatchAddedToken(text, pos);
    if (t == nullptr) {
      ++pos;
      continue;
    }
    std::string_view before = text.substr(section, pos - section);
    if (t->lstrip) before = TrimTrailingWhiteSpace(before);
    EncodeSection(before, &out);
    out.push_back(t->id);
    pos += t->content.size();
    if (t->rstrip) pos = SkipWhiteSpace(text, pos);
    section = pos;
  }
  EncodeSection(text.substr(section), &out);
  return out;
}

void BpeTokenizer::EncodeSection(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_ && !IsAscii(text)) {
    normalized = Nfc(text);
    text = normalized;
  }
  std::vector<std::string_view> pieces = {text};
  std::vector<std::string_view> next;
  std::deque<std::string> prefixed;  // owns pieces given a leading space
  for (const auto& step : pre_tokenizer_) {
    if (step.add_prefix_space) {
      for (std::string_view& p : pieces) {
        if (!p.empty() && p[0] == ' ') continue;
        std::string& s = prefixed.emplace_back(1, ' ');
        s.append(p);
        p = s;
      }
    }
    if (step.split) {
      next.clear();
      for (std::string_view p : pieces) step.split->Split(p, &next);
      pieces.swap(next);
    }
  }
  for (std::string_view p : pieces) EncodeWord(p, out);
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_ || word.size() == 1) {
    if (auto it = id_of_bytes_.find(Key(word)); it != id_of_bytes_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    MergeWord(word, out);
    return;
  }
  CacheShard& shard = cache_[absl::Hash<absl::string_view>{}(Key(word)) % kCacheShards];
  {
    absl::MutexLock lock(&shard.mu);
    if (auto it = shard.words.find(Key(word)); it != shard.words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  MergeWord(word, out);
  std::vector<int32_t> ids(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
  absl::MutexLock lock(&shard.mu);
  if (shard.words.size() >= kCacheShardCapacity) shard.words.clear();
  shard.words.emplace(std::string(word), std::move(ids));
}

void BpeTokenizer::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  // Symbols form a linked list over the word's bytes; a merge folds the right
  // symbol into the left one. Candidates are (rank, position) in a min-heap;
  // a stale candidate is recognised because the pair at its position no
  // longer merges into the same token (a pair's bytes only ever grow).
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1: none
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  for (char c : word) {
    const int32_t id = byte_id_[static_cast<unsigned char>(c)];
    if (id < 0) continue;  // no token for this byte (never in a byte-level vocabulary): dropped
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1});
    if (n > 0) symbols[n - 1].next = n;
  }
  auto push_candidate = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.merged});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    const Symbol& right = symbols[left.next];
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.merged != c.merged) continue;
    const int32_t gone = left.next;
    left.id = c.merged;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    symbols[gone].id = -1;
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(c.pos);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    out->push_back(symbols[i].id);
  }
}

std::string BpeTokenizer::TokenBytes(int32_t id, int32_t /*prev*/) const {
  if (id < 0 || id >= vocab_size()) return {};
  return bytes_[id];
}

std::string BpeTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

}  // namespace kvserve
