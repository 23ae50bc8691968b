// Loading the tokenizer of a Hugging Face checkpoint.
//
//   tokenizer.json          byte-level BPE (Llama 3, Qwen 2/3): BpeTokenizer
//   tokenizer_config.json   optional, beside it: bos/eos/pad/unk token strings,
//                           add_bos_token, additional_special_tokens
//   tokenizer.model         SentencePiece (Llama 2, Mistral, llama2.c)
//
// A directory's tokenizer.json is preferred; tokenizer.model is used when
// there is no tokenizer.json, or when the tokenizer.json is not byte-level
// BPE (Llama 2's and Mistral's files describe their SentencePiece model,
// which tokenizer.model serves exactly).
//
// What is supported in tokenizer.json, everything else being refused with
// the field named (Unimplemented for a kind of tokenizer kvserve does not
// implement, InvalidArgument for a broken file):
//   model        BPE: vocab, merges ("a b" strings or [a, b] pairs), ignore_merges
//   normalizer   null, NFC, or a Sequence of those
//   pre_tokenizer ByteLevel (add_prefix_space, use_regex: the GPT-2 regex),
//                Split (Regex or String pattern, behavior Isolated or
//                Removed, invert false), or a Sequence of those, with a
//                ByteLevel among them
//   decoder      ByteLevel (alone or in a Sequence)
//   post_processor only to learn whether BOS is prepended: a
//                TemplateProcessing whose single sequence starts with a
//                special token (Llama 3.1); tokenizer_config.json's
//                add_bos_token overrides it.
//   added_tokens content, id, special, lstrip, rstrip. Added tokens are matched
//                in the raw text before normalization whatever their
//                `normalized` says (the two differ only when NFC changes a
//                token's own text, which no real token's does); single_word
//                is ignored.
// Decoding never applies clean_up_tokenization_spaces (it rewrites " ." to
// "." and so cannot stream); vLLM does not apply it either.
//
// Thread-safety: the functions are thread-compatible; the tokenizers they
// return are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {

struct LoadedTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  SpecialTokenStrings special_tokens;
};

// tokenizer.json (with tokenizer_config.json, config.json and
// generation_config.json beside it when present: BOS/EOS ids come from the
// token strings of tokenizer_config.json, else from the ids of the other two).
absl::StatusOr<LoadedTokenizer> LoadTokenizerJson(const std::string& path);
// A tokenizer file: *.json as tokenizer.json, anything else as SentencePiece.
absl::StatusOr<LoadedTokenizer> LoadTokenizerFile(const std::string& path);
// The tokenizer of an HF directory, chosen as described above.
absl::StatusOr<LoadedTokenizer> LoadHfDirectoryTokenizer(const std::string& dir);

// GPT-2's byte <-> unicode map, which makes every byte a printable
// character (' ' -> 'Ġ', '\n' -> 'Ċ'). ByteLevelPiece maps bytes to a piece;
// ByteLevelBytes maps a piece back, false when a character of it is not in
// the map.
std::string ByteLevelPiece(std::string_view bytes);
bool ByteLevelBytes(std::string_view piece, std::string* bytes);

}  // namespace kvserve
