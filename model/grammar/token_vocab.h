// TokenVocab: the model's vocabulary as byte strings in a trie, the structure
// a token mask is computed over (GrammarMatcher::FillMask).
//
// The trie is stored in depth-first preorder: node i has the byte that leads
// to it, its depth and the end of its subtree, so a walk that finds a prefix
// rejected skips the whole subtree in one jump. Tokens with no bytes (control
// and special tokens) are not in the trie: a grammar never allows them, except
// the end tokens where it may end.
//
// Bytes are what a token adds in the middle of a text, TokenBytes(id, prev)
// with a prev that is not BOS (MidTextPrev): a SentencePiece piece's leading
// "▁" as a space and byte-fallback pieces <0xAB> as that byte; byte-level BPE
// tokens as their bytes. (Right after BOS a SentencePiece token drops its
// space; the engine feeds the grammar the bytes actually added.)
//
// Length levels: the mask of a grammar state is put together from the mask
// of a related state for the tokens of at most levels()[i] bytes
// (short_mask(i)) and a walk over the longer ones (CompiledGrammar). That
// walk reads long_tokens(d): the tokens longer than a threshold at most d, in
// trie order and front-coded, so it runs through one array instead of
// jumping over the trie's subtrees of short tokens.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvserve {

class Tokenizer;

class TokenVocab {
 public:
  struct Node {
    uint8_t byte = 0;
    int32_t depth = 0;        // 1 for a first byte
    int32_t subtree_end = 0;  // one past the last node of its subtree
    int32_t first_token = 0;  // into token_ids_: tokens whose bytes end here
    int32_t num_tokens = 0;
    int32_t max_depth = 0;  // of its subtree: its longest token's length
  };

  // bytes[id]: the bytes of token id ("" for control tokens).
  explicit TokenVocab(std::vector<std::string> bytes);
  static std::shared_ptr<const TokenVocab> FromTokenizer(const Tokenizer& tokenizer);
  // A token id that is not BOS, for TokenBytes' prev.
  static int32_t MidTextPrev(const Tokenizer& tokenizer);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  // Words of a mask: bit (id % 32) of word (id / 32) allows token id.
  int32_t mask_words() const { return (vocab_size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const int32_t* node_tokens(const Node& n) const { return token_ids_.data() + n.first_token; }
  // The tokens of node i's whole subtree: token_ids()[first, last), since
  // tokens are laid out in preorder.
  std::pair<int32_t, int32_t> subtree_tokens(size_t i) const {
    const size_t end = nodes_[i].subtree_end;
    return {nodes_[i].first_token, end < nodes_.size() ? nodes_[end].first_token
                                                       : static_cast<int32_t>(token_ids_.size())};
  }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  // The longest token's length in bytes.
  int32_t max_token_bytes() const { return max_token_bytes_; }
  // Tokens longer than `longer_than` bytes in trie order: entry i's bytes are
  // the first lcp bytes of entry i - 1's, then bytes[suffix, suffix + len -
  // lcp).
  struct LongTokens {
    struct Entry {
      int32_t id = 0, lcp = 0, len = 0, suffix = 0;
    };
    int32_t longer_than = 0;
    std::vector<Entry> entries;
    std::string bytes;
  };
  // The list with the largest threshold of at most `d` bytes; null if none.
  const LongTokens* long_tokens(int32_t d) const;

  // Ascending token lengths, the last one max_token_bytes(): every length
  // up to 8, then about four per doubling.
  const std::vector<int32_t>& levels() const { return levels_; }
  // mask_words() words: the tokens of 1 to levels()[i] bytes.
  const std::vector<uint32_t>& short_mask(size_t i) const { return short_masks_[i]; }

 private:
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  int32_t max_token_bytes_ = 0;
  std::vector<int32_t> levels_;
  std::vector<std::vector<uint32_t>> short_masks_;
  std::vector<LongTokens> long_tokens_;  // ascending thresholds
};

}  // namespace kvserve
