// The detokenizer's UTF-8 hold-back, on the stories260K tokenizer (512
// pieces, so most non-ASCII text falls back to byte pieces) and on a tiny
// byte-level BPE.
#include "scheduler/detokenizer.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer/hf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/tiny_bpe.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

std::unique_ptr<Tokenizer> LoadTokenizer() {
  auto tok = Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
  REQUIRE(tok.ok());
  return std::move(*tok);
}

TEST_CASE("UTF-8 prefix decoding holds back incomplete characters only", "[scheduler]") {
  std::string out;
  SECTION("a complete string passes through") {
    REQUIRE(DecodeUtf8Prefix("caf\xC3\xA9", false, &out) == 5);
    REQUIRE(out == "caf\xC3\xA9");
  }
  SECTION("an emoji cut after two of its four bytes waits") {
    REQUIRE(DecodeUtf8Prefix("ab\xF0\x9F", false, &out) == 2);
    REQUIRE(out == "ab");
  }
  SECTION("at the end an incomplete tail becomes one U+FFFD per byte") {
    REQUIRE(DecodeUtf8Prefix("ab\xF0\x9F", true, &out) == 4);
    REQUIRE(out == "ab\xEF\xBF\xBD\xEF\xBF\xBD");
  }
  SECTION("bytes that can never be valid are replaced at once") {
    REQUIRE(DecodeUtf8Prefix("\x80x\xC0\xAFy\xED\xA0\x80", false, &out) == 8);
    REQUIRE(out == "\xEF\xBF\xBDx\xEF\xBF\xBD\xEF\xBF\xBDy\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    REQUIRE(IsValidUtf8(out));
  }
}

TEST_CASE("Detokenizer streams byte-fallback text as whole characters", "[scheduler]") {
  auto tok = LoadTokenizer();
  const std::string text =
      "Lily saw a \xF0\x9F\x90\xB6 dog. \xE4\xBD\xA0\xE5\xA5\xBD, caf\xC3\xA9 \xE2\x9C\x93 "
      "\xF0\x9F\x98\x80\xF0\x9F\x98\x80!";
  std::vector<int32_t> ids = tok->Encode(text, /*add_bos=*/true);
  REQUIRE(ids.front() == tok->bos_id());

  Detokenizer detok(tok.get(), ids[0]);
  std::string streamed;
  size_t max_held = 0;
  int byte_pieces = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    if (tok->IdToPiece(ids[i]).rfind("<0x", 0) == 0) ++byte_pieces;
    std::string piece;
    detok.Add(ids[i], &piece);
    REQUIRE(IsValidUtf8(piece));
    max_held = std::max(max_held, detok.pending_bytes());
    streamed += piece;
  }
  std::string tail;
  detok.Finish(&tail);
  REQUIRE(tail.empty());
  // The 4-byte emoji arrive as byte pieces, so some bytes had to wait.
  REQUIRE(byte_pieces >= 16);
  REQUIRE(max_held == 3);
  REQUIRE(streamed == text);
  REQUIRE(streamed == tok->Decode(std::span<const int32_t>(ids).subspan(1), ids[0]));
}

TEST_CASE("Detokenizer streams byte-level BPE tokens that end inside a character", "[scheduler]") {
  // tiny_bpe.h: "😀" is two tokens of two bytes each.
  const std::string dir = testing::MakeTempDir("detok-bpe");
  testing::WriteJson(dir, "tokenizer_config.json", testing::TinyBpeTokenizerConfig());
  auto loaded =
      LoadTokenizerJson(testing::WriteJson(dir, "tokenizer.json", testing::TinyBpeTokenizerJson()));
  REQUIRE(loaded.ok());
  const Tokenizer& tok = *loaded->tokenizer;
  const std::string text = "hello \xF0\x9F\x98\x80 world<think><|end|>";
  const std::vector<int32_t> ids = tok.Encode(text, /*add_bos=*/true);
  REQUIRE(ids == std::vector<int32_t>{300, 259, 32, 264, 265, 262, 108, 100, 302, 301});

  Detokenizer detok(&tok, ids[0]);
  std::vector<std::string> pieces;
  std::vector<size_t> held;
  for (size_t i = 1; i < ids.size(); ++i) {
    std::string piece;
    detok.Add(ids[i], &piece);
    pieces.push_back(piece);
    held.push_back(detok.pending_bytes());
  }
  std::string tail;
  detok.Finish(&tail);
  REQUIRE(pieces == std::vector<std::string>{"hello", " ", "", "\xF0\x9F\x98\x80", " wor", "l", "d",
                                             "<think>", ""});
  REQUIRE(held == std::vector<size_t>{0, 0, 2, 0, 0, 0, 0, 0, 0});
  REQUIRE(tail.empty());
  // The special <|end|> adds nothing; everything else is the text.
  REQUIRE(tok.Decode(ids) == "hello \xF0\x9F\x98\x80 world<think>");

  SECTION("a character cut off by the end of the sequence becomes U+FFFD") {
    Detokenizer cut(&tok, -1);
    std::string out;
    cut.Add(264, &out);
    cut.Add(301, &out);
    REQUIRE(out.empty());
    REQUIRE(cut.pending_bytes() == 2);
    cut.Finish(&out);
    REQUIRE(out == "\xEF\xBF\xBD\xEF\xBF\xBD");
    REQUIRE(out == SanitizeUtf8(tok.Decode(std::vector<int32_t>{264, 301})));
  }
}

TEST_CASE("Detokenizer applies the leading-space rule only after BOS", "[scheduler]") {
  auto tok = LoadTokenizer();
  std::vector<int32_t> ids = tok->Encode("Once upon", /*add_bos=*/false);
  std::string after_bos, after_word;
  Detokenizer a(tok.get(), tok->bos_id());
  Detokenizer b(tok.get(), ids.back());
  for (int32_t id : ids) {
    a.Add(id, &after_bos);
    b.Add(id, &after_word);
  }
  REQUIRE(after_bos == "Once upon");
  REQUIRE(after_word == " Once upon");
}

TEST_CASE("Detokenizer output equals sanitized Decode for any token sequence", "[scheduler]") {
  auto tok = LoadTokenizer();
  // Byte pieces in a scrambled order produce invalid and incomplete UTF-8.
  uint32_t x = 12345;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) {
      x = x * 1664525u + 1013904223u;
      ids.push_back(static_cast<int32_t>(3 + (x >> 8) % 300));  // bytes and pieces
    }
    Detokenizer detok(tok.get(), tok->bos_id());
    std::string streamed;
    for (int32_t id : ids) {
      std::string piece;
      detok.Add(id, &piece);
      REQUIRE(IsValidUtf8(piece));
      streamed += piece;
    }
    detok.Finish(&streamed);
    REQUIRE(streamed == SanitizeUtf8(tok->Decode(ids, tok->bos_id())));
  }
}

}  // namespace
}  // namespace kvserve
