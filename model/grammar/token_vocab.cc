#include "model/grammar/token_vocab.h"

#include <algorithm>
#include <numeric>

#include "model/tokenizer/tokenizer.h"

namespace kvserve {

TokenVocab::TokenVocab(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  std::vector<int32_t> order;
  for (int32_t i = 0; i < vocab_size(); ++i) {
    if (!bytes_[i].empty()) order.push_back(i);
  }
  // Sorted byte strings are the trie's preorder: a prefix sorts before its
  // extensions, and siblings follow in byte order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  token_ids_.reserve(order.size());
  std::vector<int32_t> path;  // node index at each depth - 1
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    size_t common = 0;
    if (prev != nullptr) {
      const size_t limit = std::min(prev->size(), s.size());
      while (common < limit && (*prev)[common] == s[common]) ++common;
    }
    // Close the nodes below the common prefix.
    while (path.size() > common) {
      nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      Node n;
      n.byte = static_cast<uint8_t>(s[d]);
      n.depth = static_cast<int32_t>(d + 1);
      n.first_token = static_cast<int32_t>(token_ids_.size());
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back(n);
    }
    Node& leaf = nodes_[path.back()];
    if (leaf.num_tokens == 0) leaf.first_token = static_cast<int32_t>(token_ids_.size());
    token_ids_.push_back(id);
    ++leaf.num_tokens;
    prev = &s;
  }
  while (!path.empty()) {
    nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
    path.pop_back();
  }
  // In preorder a subtree follows its root: back to front, each node has
  // its descendants' depths.
  for (size_t i = nodes_.size(); i-- > 0;) {
    Node& n = nodes_[i];
    n.max_depth = std::max(n.max_depth, n.depth);
    max_token_bytes_ = std::max(max_token_bytes_, n.depth);
    for (size_t c = i + 1; c < static_cast<size_t>(n.subtree_end); c = nodes_[c].subtree_end) {
      n.max_depth = std::max(n.max_depth, nodes_[c].max_depth);
    }
  }
  for (int32_t len = 1; len < max_token_bytes_;) {
    levels_.push_back(len);
    len += len < 8 ? 1 : len / 4;
  }
  if (max_token_bytes_ > 0) levels_.push_back(max_token_bytes_);
  for (int32_t longer_than : {4, 6, 8, 12, 16, 24, 32, 48, 64, 96}) {
    if (longer_than >= max_token_bytes_) break;
    LongTokens& list = long_tokens_.emplace_back();
    list.longer_than = longer_than;
    const std::string* prev = nullptr;
    for (int32_t id : token_ids_) {
      const std::string& t = bytes_[id];
      if (t.size() <= static_cast<size_t>(longer_than)) continue;
      size_t lcp = 0;
      if (prev != nullptr) {
        const size_t limit = std::min(prev->size(), t.size());
        while (lcp < limit && (*prev)[lcp] == t[lcp]) ++lcp;
      }
      list.entries.push_back(LongTokens::Entry{id, static_cast<int32_t>(lcp),
                                               static_cast<int32_t>(t.size()),
                                               static_cast<int32_t>(list.bytes.size())});
      list.bytes.append(t, lcp);
      prev = &t;
    }
  }
  for (int32_t level : levels_) {
    std::vector<uint32_t>& m = short_masks_.emplace_back(mask_words(), 0);
    for (int32_t id = 0; id < vocab_size(); ++id) {
      const size_t len = bytes_[id].size();
      if (len > 0 && len <= static_cast<size_t>(level)) m[id >> 5] |= uint32_t{1} << (id & 31);
    }
  }
}

const TokenVocab::LongTokens* TokenVocab::long_tokens(int32_t d) const {
  const LongTokens* best = nullptr;
  for (const LongTokens& list : long_tokens_) {
    if (list.longer_than <= d) best = &list;
  }
  return best;
}

int32_t TokenVocab::MidTextPrev(const Tokenizer& tokenizer) {
  return tokenizer.bos_id() == 0 ? 1 : 0;
}

std::shared_ptr<const TokenVocab> TokenVocab::FromTokenizer(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  const int32_t prev = MidTextPrev(tokenizer);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    bytes[id] = tokenizer.TokenBytes(id, prev);
  return std::make_shared<const TokenVocab>(std::move(bytes));
}

}  // namespace kvserve
