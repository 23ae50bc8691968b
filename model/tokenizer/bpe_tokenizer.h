// BpeTokenizer: byte-level BPE (GPT-2 style: Llama 3, Qwen 2/3), the
// Tokenizer behind a Hugging Face tokenizer.json. hf_tokenizer.h parses the
// file into a BpeTokenizerSpec; this class only encodes and decodes.
//
// Encode follows HF tokenizers' pipeline:
//   1. split the text on added tokens (special or not), leftmost-longest,
//      each one becoming its own id; lstrip/rstrip swallow the whitespace
//      beside it;
//   2. every other section is normalized (NFC when the file asks for it),
//   3. pre-tokenized by the steps in order (regex Split; ByteLevel's optional
//      prefix space and GPT-2 regex),
//   4. and each piece is BPE-merged: its bytes start as one symbol each (the
//      256 byte tokens) and the adjacent pair of lowest merge rank is merged,
//      leftmost first, until no pair has a rank. With ignore_merges a piece
//      that is itself a token is taken whole.
// Pieces are handled as raw bytes throughout: the vocabulary is keyed by the
// bytes a token stands for, so the GPT-2 byte<->unicode map is applied only
// once, when the file is loaded.
//
// Decoding: TokenBytes(id, prev) is the token's bytes, independent of prev
// (byte-level BPE has no leading-space rule), and may end in the middle of a
// UTF-8 character, which the streaming Detokenizer holds back. Special added
// tokens (<|eot_id|>, <|im_end|>) give no bytes, as control tokens do on the
// SentencePiece path and as HF decodes with skip_special_tokens=True (what
// vLLM serves by default); added tokens with special=false (<think>,
// <tool_call>) give their content. IdToPiece gives every token as written in
// the file ("Ġthe", "<|eot_id|>").
//
// Thread-safety: immutable after construction except for the word cache,
// which is sharded and locked; every method is safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "model/tokenizer/regex_splitter.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {

struct BpeTokenizerSpec {
  struct Token {
    int32_t id = 0;
    std::string bytes;  // what the token stands for (byte-level decoded)
    std::string piece;  // as written in tokenizer.json
  };
  struct Merge {
    int32_t left = 0, right = 0, merged = 0;
  };
  struct AddedToken {
    int32_t id = 0;
    std::string content;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
  };
  // A pre-tokenizer step: optionally prepend ' ' to every piece that does
  // not start with one, then optionally split every piece.
  struct PreTokenizeStep {
    bool add_prefix_space = false;
    std::optional<RegexSplitter> split;
  };

  std::vector<Token> vocab;
  std::vector<Merge> merges;  // rank order
  std::vector<AddedToken> added_tokens;
  bool nfc = false;
  std::vector<PreTokenizeStep> pre_tokenizer;
  bool ignore_merges = false;
  int32_t bos_id = -1;  // -1: none
  int32_t eos_id = -1;
  bool add_bos = false;  // whether Encode(text, add_bos=true) prepends bos_id
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeTokenizerSpec spec);

  int vocab_size() const override { return static_cast<int>(bytes_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  // add_bos prepends BOS only for checkpoints whose tokenizer adds one
  // (Llama 3 does, Qwen does not).
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const override;
  std::string TokenBytes(int32_t id, int32_t prev) const override;
  std::string IdToPiece(int32_t id) const override;

 private:
  struct MergeRule {
    uint32_t rank;
    int32_t merged;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  // The added token that starts at text[pos] (the longest), or nullptr.
  const BpeTokenizerSpec::AddedToken* MatchAddedToken(std::string_view text, size_t pos) const;
  // Normalizes, pre-tokenizes and BPE-encodes text with no added tokens.
  void EncodeSection(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;

  // Per id: the bytes it adds when decoded, and its piece.
  std::vector<std::string> bytes_;
  std::vector<std::string> pieces_;
  absl::flat_hash_map<std::string, int32_t> id_of_bytes_;  // base vocabulary
  std::array<int32_t, 256> byte_id_;                       // -1: no token
  absl::flat_hash_map<uint64_t, MergeRule> merges_;

  std::vector<BpeTokenizerSpec::AddedToken> added_;
  absl::flat_hash_map<std::string, int> added_index_;  // content -> index in added_
  std::vector<size_t> added_lengths_;                  // distinct, longest first
  std::array<bool, 256> added_first_byte_{};

  bool nfc_;
  std::vector<BpeTokenizerSpec::PreTokenizeStep> pre_tokenizer_;
  bool ignore_merges_;
  int32_t bos_id_, eos_id_;
  bool add_bos_;

  // Word -> ids. Sharded so that concurrent Encode calls rarely contend; a
  // full shard is cleared (words repeat, so it refills with the common ones).
  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheShardCapacity = 8192;
  static constexpr size_t kMaxCachedWordBytes = 64;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words ABSL_GUARDED_BY(mu);
  };
  mutable std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace kvserve
