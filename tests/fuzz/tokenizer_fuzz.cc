// Fuzzes the tokenizers on arbitrary bytes: the stories260K SentencePiece
// model and the byte-level BPE of tests/model/tiny_bpe.h (written to a
// scratch tokenizer.json once, loaded by model/tokenizer/hf_tokenizer.h).
//
// Input: the first byte picks the tokenizer (bit 0), add_bos (bit 1) and
// whether the rest is text to encode or token ids to decode (bit 2).
// Properties: encoded ids are in the vocabulary; byte-level BPE gives back
// exactly the text it encoded when the text holds no added token; decoding
// any ids in the vocabulary works, one token at a time or all at once.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "model/tokenizer/hf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/tiny_bpe.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

struct State {
  std::unique_ptr<Tokenizer> sentencepiece;
  std::unique_ptr<Tokenizer> bpe;
};

State* Init() {
  auto* s = new State();
  auto sp = Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
  FUZZ_CHECK(sp.ok());
  s->sentencepiece = *std::move(sp);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvserve-fuzz-bpe-" + std::to_string(::getpid())))
          .string();
  auto bpe =
      LoadTokenizerJson(testing::WriteJson(dir, "tokenizer.json", testing::TinyBpeTokenizerJson()));
  std::filesystem::remove_all(dir);
  FUZZ_CHECK(bpe.ok());
  s->bpe = std::move(bpe->tokenizer);
  return s;
}

}  // namespace
}  // namespace kvserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  static State* state = Init();
  if (size == 0) return 0;
  const bool use_bpe = data[0] & 1;
  const bool add_bos = data[0] & 2;
  const bool decode = data[0] & 4;
  const Tokenizer& tok = use_bpe ? *state->bpe : *state->sentencepiece;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const int vocab = tok.vocab_size();

  if (!decode) {
    std::vector<int32_t> ids = tok.Encode(rest, add_bos);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < vocab);
    if (add_bos && tok.bos_id() >= 0) FUZZ_CHECK(!ids.empty() && ids[0] == tok.bos_id());
    std::string text = tok.Decode(ids);
    if (use_bpe && rest.find("<|") == std::string_view::npos &&
        rest.find("<think>") == std::string_view::npos) {
      FUZZ_CHECK(text == rest);
    }
    return 0;
  }
  // Two bytes per token id, taken modulo the vocabulary.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < rest.size(); i += 2) {
    uint16_t v;
    std::memcpy(&v, rest.data() + i, 2);
    ids.push_back(v % vocab);
  }
  std::string whole = tok.Decode(ids);
  std::string pieces;
  int32_t prev = -1;
  for (int32_t id : ids) {
    pieces += tok.TokenBytes(id, prev);
    (void)tok.IdToPiece(id);
    prev = id;
  }
  FUZZ_CHECK(whole == pieces);
  return 0;
}
