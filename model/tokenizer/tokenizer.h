// Tokenizer: text <-> token ids. SentencePiece models (the Llama family's),
// byte-level BPE from a Hugging Face tokenizer.json (Llama 3, Qwen; see
// bpe_tokenizer.h and hf_tokenizer.h), or a byte-level fallback for dummy
// models without a tokenizer file.
//
// TokenBytes gives the exact bytes one token adds to the text, which is what
// streaming detokenization needs: SentencePiece's "▁" becomes a space, byte
// pieces <0xAB> become that byte, control tokens add nothing, and the space a
// piece carries is dropped right after BOS (the leading-space rule, as in
// llama2.c's run.c and SentencePiece's own Decode).
//
// Thread-safety: const methods are safe to call from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

// The special tokens as text, for chat templates (their bos_token and
// eos_token variables); empty when the checkpoint has none.
struct SpecialTokenStrings {
  std::string bos_token;
  std::string eos_token;
  std::string pad_token;
  std::string unk_token;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // A SentencePiece .model file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::string& path);
  // ids 0/1/2 are <unk>/<s>/</s>, 3 + b is byte b; vocab_size must be >= 259.
  static std::unique_ptr<Tokenizer> ByteLevel(int vocab_size);

  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  // Token ids of text, with BOS first when add_bos.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos) const = 0;
  // The bytes token `id` appends when it follows token `prev` (-1: none).
  virtual std::string TokenBytes(int32_t id, int32_t prev) const = 0;
  // The printable piece of a token (for logprobs and debugging).
  virtual std::string IdToPiece(int32_t id) const = 0;

  // Concatenated TokenBytes of ids; ids[0]'s predecessor is `prev`.
  std::string Decode(std::span<const int32_t> ids, int32_t prev = -1) const;
};

}  // namespace kvserve
