#include "model/tokenizer/tokenizer.h"

#include <catch2/catch.hpp>

#include "tests/test_util.h"

namespace kvserve {
namespace {

TEST_CASE("SentencePiece tokenizer round-trips text", "[model]") {
  auto tok = Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
  REQUIRE(tok.ok());
  const Tokenizer& t = **tok;
  REQUIRE(t.vocab_size() == 512);
  REQUIRE(t.bos_id() == 1);
  REQUIRE(t.eos_id() == 2);

  for (std::string text :
       {"Once upon a time, there was a little girl named Lily.", "She said, \"I'm sorry, mom.\"",
        "caf\xC3\xA9 \xE2\x9C\x93 \xF0\x9F\x98\x80"}) {
    std::vector<int32_t> ids = t.Encode(text, /*add_bos=*/true);
    REQUIRE(ids.front() == 1);
    REQUIRE(t.Decode(ids) == text);
  }
}

TEST_CASE("TokenBytes drops the leading space only after BOS", "[model]") {
  auto tok = Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
  REQUIRE(tok.ok());
  std::vector<int32_t> ids = (*tok)->Encode("Once", false);
  REQUIRE(!ids.empty());
  REQUIRE((*tok)->TokenBytes(ids[0], 1).rfind("O", 0) == 0);
  REQUIRE((*tok)->TokenBytes(ids[0], 5)[0] == ' ');
}

TEST_CASE("A missing tokenizer file is a clear error", "[model]") {
  auto tok = Tokenizer::LoadSentencePiece("/nonexistent/tok.model");
  REQUIRE_FALSE(tok.ok());
  REQUIRE(std::string(tok.status().message()).find("/nonexistent/tok.model") != std::string::npos);
}

}  // namespace
}  // namespace kvserve
