// Detokenizer: turns one sequence's generated token ids into text
// incrementally, so every piece it hands out is whole, valid UTF-8.
//
// Each token adds Tokenizer::TokenBytes(id, prev) to a byte buffer (which
// already handles SentencePiece byte-fallback pieces and the leading space
// after BOS). The longest decodable prefix of the buffer is released; a tail
// that is a valid but incomplete UTF-8 sequence (an emoji split over byte
// pieces) is held back until the bytes that complete it arrive. Bytes that can
// never become valid UTF-8 are replaced by U+FFFD, one per byte, exactly as
// SanitizeUtf8 does for a whole string, so the concatenation of the streamed
// pieces plus Finish() always equals SanitizeUtf8(Decode(all ids)).
//
// Thread-safety: value type owned by one sequence on the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "model/tokenizer/tokenizer.h"

namespace kvserve {

// Appends to *out the longest prefix of `bytes` that can be decided: whole
// valid UTF-8 characters are copied, invalid bytes become U+FFFD. Unless
// `final`, stops before a trailing incomplete (but so far valid) sequence.
// Returns the number of bytes consumed.
size_t DecodeUtf8Prefix(std::string_view bytes, bool final, std::string* out);
// The whole of `bytes` as valid UTF-8 (invalid bytes -> U+FFFD).
std::string SanitizeUtf8(std::string_view bytes);
// True when `text` is entirely valid UTF-8.
bool IsValidUtf8(std::string_view text);

class Detokenizer {
 public:
  // `prev` is the token before the first one this detokenizer sees (the last
  // prompt token), which decides the leading-space rule.
  Detokenizer(const Tokenizer* tokenizer, int32_t prev) : tokenizer_(tokenizer), prev_(prev) {}

  // Adds a token; appends newly decidable text to *out.
  void Add(int32_t id, std::string* out);
  // End of the sequence: releases what is held back (invalid -> U+FFFD).
  void Finish(std::string* out);

  // Bytes held back waiting for the rest of a UTF-8 character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  int32_t prev_;
  std::string pending_;
};

}  // namespace kvserve
