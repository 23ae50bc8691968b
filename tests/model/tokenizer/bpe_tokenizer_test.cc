// Byte-level BPE on the tiny hand-written tokenizer.json of tiny_bpe.h
// (exact ids, no npm): merge order, added tokens, pre-tokenizer variants,
// NFC, decoding, errors naming the field, and which tokenizer a directory
// gets. bpe_reference_test.cc compares real tokenizers with the reference.
#include "model/tokenizer/bpe_tokenizer.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "model/tokenizer/hf_tokenizer.h"
#include "model/tokenizer/regex_splitter.h"
#include "tests/model/tiny_bpe.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// Loads `tokenizer` (with `config` as tokenizer_config.json unless null)
// from a fresh directory.
absl::StatusOr<LoadedTokenizer> Load(const json& tokenizer, const json& config = nullptr) {
  const std::string dir = testing::MakeTempDir("bpe");
  if (!config.is_null()) testing::WriteJson(dir, "tokenizer_config.json", config);
  return LoadTokenizerJson(testing::WriteJson(dir, "tokenizer.json", tokenizer));
}

std::unique_ptr<Tokenizer> LoadOrDie(const json& tokenizer,
                                     const json& config = testing::TinyBpeTokenizerConfig()) {
  auto t = Load(tokenizer, config);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return std::move(t->tokenizer);
}

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

std::vector<std::string> Split(const RegexSplitter& r, std::string_view text) {
  std::vector<std::string_view> pieces;
  r.Split(text, &pieces);
  return {pieces.begin(), pieces.end()};
}

TEST_CASE("Byte-level BPE merges by rank, leftmost first", "[model]") {
  auto t = LoadOrDie(testing::TinyBpeTokenizerJson());
  REQUIRE(t->vocab_size() == 304);
  REQUIRE(t->bos_id() == 300);
  REQUIRE(t->eos_id() == 301);

  SECTION("merges apply lowest rank first, across the whole word") {
    REQUIRE(t->Encode("hello", false) == Ids{259});
    // Ġ w (rank 4) before o r (5), then Ġw or (6); "ld" has no merge.
    REQUIRE(t->Encode("hello world", false) == Ids{259, 262, 108, 100});
    REQUIRE(t->Encode("help", false) == Ids{256, 108, 112});
  }
  SECTION("equal ranks merge leftmost first") {
    REQUIRE(t->Encode("aaa", false) == Ids{263, 97});
    REQUIRE(t->Encode("aaaa aaaaa", false) == Ids{263, 263, 32, 263, 263, 97});
  }
  SECTION("the post-processor's template prepends BOS when asked") {
    REQUIRE(t->Encode("hello", true) == Ids{300, 259});
    REQUIRE(t->Encode("", true) == Ids{300});
    REQUIRE(t->Encode("", false).empty());
  }
  SECTION("a character split over tokens decodes to its exact bytes") {
    REQUIRE(t->Encode("\xF0\x9F\x98\x80", false) == Ids{264, 265});
    REQUIRE(t->TokenBytes(264, -1) == "\xF0\x9F");
    REQUIRE(t->TokenBytes(265, 264) == "\x98\x80");
    REQUIRE(t->IdToPiece(264) == "ðŁ");
  }
  SECTION("decoding is the bytes of each token, whatever came before") {
    const std::string text = "hello world\n\taaa \xF0\x9F\x98\x80 caf\xC3\xA9!";
    const Ids ids = t->Encode(text, true);
    REQUIRE(t->Decode(ids) == text);
    REQUIRE(t->TokenBytes(32, -1) == " ");
    REQUIRE(t->TokenBytes(32, 300) == " ");  // no leading-space rule after BOS
    REQUIRE(t->IdToPiece(32) == "Ġ");
    REQUIRE(t->IdToPiece(10) == "Ċ");
    REQUIRE(t->IdToPiece(262) == "Ġwor");
  }
  SECTION("text that is not UTF-8 keeps its bytes") {
    REQUIRE(t->Encode("\xFFhello\xC3", false) == Ids{255, 259, 195});
    REQUIRE(t->Decode(t->Encode("a\xFF\xFE b", false)) == "a\xFF\xFE b");
  }
  SECTION("ids outside the vocabulary or in its holes decode to nothing") {
    for (int32_t id : {-1, 280, 304, 1 << 30}) {
      REQUIRE(t->TokenBytes(id, -1).empty());
      REQUIRE(t->IdToPiece(id).empty());
    }
  }
}

TEST_CASE("A merge listed twice takes its last rank, as Hugging Face tokenizers does", "[model]") {
  // The tokenizers library (and transformers.js) build the merge map by
  // inserting the merges in order into a hash map, so a repeated pair keeps
  // the rank of its last occurrence.
  json j = testing::TinyBpeTokenizerJson();
  j["model"]["vocab"]["el"] = 267;
  j["model"]["merges"].push_back("e l");  // rank 10
  j["model"]["merges"].push_back("h e");  // rank 11, again (first at rank 0)
  auto t = LoadOrDie(j);
  // "h e" at 11 now comes after "e l" at 10: "hel" is h + el.
  REQUIRE(t->Encode("hel", false) == Ids{104, 267});
  // Without the repeat, "h e" (rank 0) wins.
  json once = testing::TinyBpeTokenizerJson();
  once["model"]["vocab"]["el"] = 267;
  once["model"]["merges"].push_back("e l");
  REQUIRE(LoadOrDie(once)->Encode("hel", false) == Ids{256, 108});
}

TEST_CASE("Added tokens split the text first and decode by their special flag", "[model]") {
  auto t = LoadOrDie(testing::TinyBpeTokenizerJson());
  SECTION("special and non-special added tokens are whole tokens anywhere") {
    REQUIRE(t->Encode("hi<|end|>there", false) == Ids{104, 105, 301, 116, 256, 114, 101});
    REQUIRE(t->Encode("<|begin|><think>hello</think>", false) ==
            Ids{300, 302, 259, 60, 47, 116, 104, 105, 110, 107, 62});
    REQUIRE(t->Encode("<|end|><|end|>", true) == Ids{300, 301, 301});
    // An incomplete one is just text.
    REQUIRE(t->Encode("<|end", false) == Ids{60, 124, 101, 110, 100});
  }
  SECTION("lstrip and rstrip swallow the whitespace beside the token") {
    REQUIRE(t->Encode("a  <|pad|> \n b", false) == Ids{97, 303, 98});
    REQUIRE(t->Encode("a  <|end|> b", false) == Ids{97, 32, 32, 301, 32, 98});
  }
  SECTION("special tokens decode to nothing, others to their text") {
    REQUIRE(t->TokenBytes(300, -1).empty());
    REQUIRE(t->TokenBytes(301, 259).empty());
    REQUIRE(t->TokenBytes(303, -1).empty());
    REQUIRE(t->TokenBytes(302, -1) == "<think>");
    REQUIRE(t->IdToPiece(301) == "<|end|>");
    REQUIRE(t->Decode(t->Encode("x<think>y<|end|>", true)) == "x<think>y");
  }
  SECTION("additional_special_tokens makes an added token special") {
    json config = testing::TinyBpeTokenizerConfig();
    config["additional_special_tokens"] = {"<think>"};
    REQUIRE(LoadOrDie(testing::TinyBpeTokenizerJson(), config)->TokenBytes(302, -1).empty());
  }
}

TEST_CASE("tokenizer.json variants: merge format, ignore_merges, NFC, GPT-2 regex", "[model]") {
  const auto plain = LoadOrDie(testing::TinyBpeTokenizerJson());
  const std::vector<std::string> texts = {"hello world", "aaaa aaa\n\n", "\xF0\x9F\x98\x80 xyz",
                                          "<|end|> help"};
  SECTION("[a, b] merges equal \"a b\" merges") {
    const auto arrays = LoadOrDie(testing::TinyBpeTokenizerJson(/*array_merges=*/true));
    for (const std::string& s : texts) REQUIRE(arrays->Encode(s, true) == plain->Encode(s, true));
  }
  SECTION("ignore_merges takes a word that is a token whole") {
    json j = testing::TinyBpeTokenizerJson();
    REQUIRE(plain->Encode(" xyz", false) == Ids{32, 120, 121, 122});
    j["model"]["ignore_merges"] = true;
    const auto whole = LoadOrDie(j);
    REQUIRE(whole->Encode(" xyz", false) == Ids{266});
    REQUIRE(whole->Encode(" xyzw", false) == Ids{32, 120, 121, 122, 119});
    REQUIRE(whole->Encode("hello world", false) == Ids{259, 262, 108, 100});
  }
  SECTION("NFC composes before pre-tokenizing, only when the file says so") {
    const std::string decomposed = "cafe\xCC\x81";  // e + U+0301
    REQUIRE(plain->Encode(decomposed, false) == Ids{99, 97, 102, 101, 204, 129});
    json j = testing::TinyBpeTokenizerJson();
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
    const auto nfc = LoadOrDie(j);
    REQUIRE(nfc->Encode(decomposed, false) == Ids{99, 97, 102, 195, 169});
    REQUIRE(nfc->Encode("A\xCC\x8A<|end|>e\xCC\x81", false) == Ids{195, 133, 301, 195, 169});
  }
  SECTION("ByteLevel alone: the GPT-2 regex and the prefix space") {
    json j = testing::TinyBpeTokenizerJson();
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
    const auto gpt2 = LoadOrDie(j);
    REQUIRE(gpt2->Encode("hello world", false) == Ids{32, 259, 262, 108, 100});
    // The prefix space goes before every section, also after an added token.
    REQUIRE(gpt2->Encode("hello<|end|>world", false) == Ids{32, 259, 301, 262, 108, 100});
    j["pre_tokenizer"]["add_prefix_space"] = false;
    REQUIRE(LoadOrDie(j)->Encode("hello world", false) == Ids{259, 262, 108, 100});
  }
  SECTION("tokenizer_config.json's add_bos_token overrides the template") {
    json config = testing::TinyBpeTokenizerConfig();
    config["add_bos_token"] = false;
    REQUIRE(LoadOrDie(testing::TinyBpeTokenizerJson(), config)->Encode("hello", true) == Ids{259});
    json no_template = testing::TinyBpeTokenizerJson();
    no_template["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
    REQUIRE(LoadOrDie(no_template)->Encode("hello", true) == Ids{259});
  }
}

TEST_CASE("Special token strings and ids come from tokenizer_config.json or the ids", "[model]") {
  SECTION("strings, or {content} objects, name added tokens") {
    auto t = Load(testing::TinyBpeTokenizerJson(), testing::TinyBpeTokenizerConfig());
    REQUIRE(t.ok());
    REQUIRE(t->special_tokens.bos_token == "<|begin|>");
    REQUIRE(t->special_tokens.eos_token == "<|end|>");
    REQUIRE(t->special_tokens.pad_token == "<|pad|>");
    REQUIRE(t->special_tokens.unk_token.empty());
  }
  SECTION("without token strings the ids of generation_config.json or config.json count") {
    const std::string dir = testing::MakeTempDir("bpe-ids");
    const std::string path =
        testing::WriteJson(dir, "tokenizer.json", testing::TinyBpeTokenizerJson());
    testing::WriteJson(dir, "config.json",
                       {{"bos_token_id", 1}, {"eos_token_id", json::array({2, 3})}});
    auto t = LoadTokenizerJson(path);
    REQUIRE(t.ok());
    REQUIRE(t->tokenizer->eos_id() == 2);
    REQUIRE(t->tokenizer->bos_id() == 300);  // the template's, not config.json's
    REQUIRE(t->tokenizer->Encode("", true) == Ids{300});
    REQUIRE(t->special_tokens.bos_token.empty());
    testing::WriteJson(dir, "generation_config.json", {{"eos_token_id", 7}});
    REQUIRE(LoadTokenizerJson(path)->tokenizer->eos_id() == 7);
    json no_template = testing::TinyBpeTokenizerJson();
    no_template.erase("post_processor");
    testing::WriteJson(dir, "tokenizer.json", no_template);
    REQUIRE(LoadTokenizerJson(path)->tokenizer->bos_id() == 1);
    REQUIRE(LoadTokenizerJson(path)->tokenizer->Encode("", true).empty());
  }
  SECTION("with no way to know, the template's BOS and no EOS") {
    auto t = Load(testing::TinyBpeTokenizerJson());
    REQUIRE(t.ok());
    REQUIRE(t->tokenizer->bos_id() == 300);
    REQUIRE(t->tokenizer->eos_id() == -1);
  }
  SECTION("a token string that is not a token is an error naming the field") {
    json config = testing::TinyBpeTokenizerConfig();
    config["eos_token"] = "</s>";
    auto t = Load(testing::TinyBpeTokenizerJson(), config);
    REQUIRE(t.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(t.status(),
                     "tokenizer_config.json: field 'eos_token' is '</s>', which is "
                     "not a token of tokenizer.json"));
  }
}

TEST_CASE("Broken or unsupported tokenizer.json files are errors naming the field", "[model]") {
  auto error = [](const std::function<void(json&)>& edit) {
    json j = testing::TinyBpeTokenizerJson();
    edit(j);
    return Load(j).status();
  };
  SECTION("a merge of unknown tokens, or of a result missing from the vocab") {
    absl::Status s = error([](json& j) { j["model"]["merges"].push_back("q z"); });
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(s, "field 'model.merges[10]' makes 'qz', which is not in model.vocab"));
    s = error([](json& j) { j["model"]["merges"][3] = "hell oo"; });
    REQUIRE(Contains(s, "field 'model.merges[3]' names 'oo', which is not in model.vocab"));
    s = error([](json& j) { j["model"]["merges"][0] = "h e l"; });
    REQUIRE(Contains(s, "field 'model.merges[0]' is \"h e l\", not two tokens"));
    s = error([](json& j) { j["model"]["merges"][0] = 5; });
    REQUIRE(Contains(s, "field 'model.merges[0]' is 5, neither"));
  }
  SECTION("a vocabulary entry that is not an id") {
    absl::Status s = error([](json& j) { j["model"]["vocab"]["hi"] = "x"; });
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(s, "field 'model.vocab' maps 'hi' to \"x\", not a token id"));
    s = error([](json& j) { j["model"].erase("vocab"); });
    REQUIRE(Contains(s, "field 'model.vocab' is missing or not an object"));
  }
  SECTION("a regex that does not compile") {
    absl::Status s = error(
        [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+"; });
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(s,
                     "tokenizer.json: field 'pre_tokenizer.pretokenizers[0].pattern': regex "
                     "(\\p{L}+ does not compile"));
  }
  SECTION("kinds kvserve does not implement are Unimplemented") {
    absl::Status s = error([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; });
    REQUIRE(s.code() == absl::StatusCode::kUnimplemented);
    REQUIRE(Contains(s, "field 'normalizer.type' is 'Lowercase'; supported: NFC, Sequence"));
    s = error([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}}; });
    REQUIRE(Contains(s, "field 'pre_tokenizer.type' is 'Metaspace'"));
    s = error([](json& j) { j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0]; });
    REQUIRE(s.code() == absl::StatusCode::kUnimplemented);
    REQUIRE(Contains(s, "field 'pre_tokenizer' has no ByteLevel step"));
    s = error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Contiguous"; });
    REQUIRE(Contains(s, "'pre_tokenizer.pretokenizers[0].behavior' is 'Contiguous'"));
    s = error([](json& j) { j["model"]["byte_fallback"] = true; });
    REQUIRE(Contains(s, "field 'model.byte_fallback' is true"));
    s = error([](json& j) { j["model"]["type"] = "WordPiece"; });
    REQUIRE(Contains(s, "field 'model.type' is 'WordPiece'; only BPE is supported"));
    s = error([](json& j) { j["decoder"] = {{"type", "Metaspace"}}; });
    REQUIRE(Contains(s, "field 'decoder' is 'Metaspace'; only ByteLevel is supported"));
  }
  SECTION("a file that is not JSON, or not there") {
    const std::string dir = testing::MakeTempDir("bpe-broken");
    std::ofstream(dir + "/tokenizer.json") << "{\"model\": ";
    auto t = LoadTokenizerJson(dir + "/tokenizer.json");
    REQUIRE(t.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(t.status(), dir + "/tokenizer.json: not valid JSON"));
    REQUIRE(LoadTokenizerFile(dir + "/none.json").status().code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("An HF directory's tokenizer: tokenizer.json first, tokenizer.model otherwise",
          "[model]") {
  const std::string dir = testing::MakeTempDir("bpe-dir");
  SECTION("neither: NotFound naming both") {
    auto t = LoadHfDirectoryTokenizer(dir);
    REQUIRE(t.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(std::string(t.status().message()) ==
            dir +
                ": no tokenizer.json or tokenizer.model in the HF directory; pass --tokenizer "
                "FILE");
  }
  fs::copy_file(testing::Stories260kTokenizer(), dir + "/tokenizer.model");
  SECTION("tokenizer.model alone: SentencePiece, with its own token strings") {
    auto t = LoadHfDirectoryTokenizer(dir);
    REQUIRE(t.ok());
    REQUIRE(t->tokenizer->vocab_size() == 512);
    REQUIRE(t->special_tokens.bos_token == "<s>");
    REQUIRE(t->special_tokens.eos_token == "</s>");
  }
  SECTION("both: tokenizer.json") {
    testing::WriteJson(dir, "tokenizer.json", testing::TinyBpeTokenizerJson());
    auto t = LoadHfDirectoryTokenizer(dir);
    REQUIRE(t.ok());
    REQUIRE(t->tokenizer->vocab_size() == 304);
    REQUIRE(t->tokenizer->Encode("hello", false) == Ids{259});
  }
  SECTION("both, but tokenizer.json is not byte-level BPE: tokenizer.model") {
    json j = testing::TinyBpeTokenizerJson();
    j["model"]["byte_fallback"] = true;
    testing::WriteJson(dir, "tokenizer.json", j);
    auto t = LoadHfDirectoryTokenizer(dir);
    REQUIRE(t.ok());
    REQUIRE(t->tokenizer->vocab_size() == 512);
    SECTION("and without tokenizer.model that is the error") {
      fs::remove(dir + "/tokenizer.model");
      REQUIRE(LoadHfDirectoryTokenizer(dir).status().code() == absl::StatusCode::kUnimplemented);
    }
  }
  SECTION("a broken byte-level tokenizer.json is an error, not a fallback") {
    json j = testing::TinyBpeTokenizerJson();
    j["model"]["merges"].push_back("q z");
    testing::WriteJson(dir, "tokenizer.json", j);
    REQUIRE(LoadHfDirectoryTokenizer(dir).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("The split regex uses Oniguruma's whitespace class (backslash s)", "[model]") {
  SECTION("\\s and \\S become White_Space classes, inside and outside brackets") {
    const std::string ws =
        R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
    REQUIRE(OnigurumaWhitespace(R"(\s+(?!\S)|[^\s\p{L}]|\\s|[]\s]|[[:alpha:]\s])") ==
            "[" + ws + "]+(?![^" + ws + "])|[^" + ws + R"(\p{L}]|\\s|[])" + ws + "]|[[:alpha:]" +
                ws + "]");
  }
  SECTION("U+0085 is whitespace, U+180E is not (PCRE2 alone says both are)") {
    auto r = RegexSplitter::Compile(R"(\s+)", false, RegexSplitter::Behavior::kIsolated, "f");
    REQUIRE(r.ok());
    REQUIRE(Split(*r,
                  "a\xC2\x85"
                  "b") == std::vector<std::string>{"a", "\xC2\x85", "b"});
    REQUIRE(Split(*r,
                  "a\xE1\xA0\x8E"
                  "b") == std::vector<std::string>{"a\xE1\xA0\x8E"
                                                   "b"});
  }
  SECTION("Llama 3's regex: case-insensitive contractions, digits in threes") {
    auto r = RegexSplitter::Compile(testing::kLlama3SplitRegex, false,
                                    RegexSplitter::Behavior::kIsolated, "f");
    REQUIRE(r.ok());
    REQUIRE(Split(*r, "DON'T stop 12345\n\n  x") ==
            std::vector<std::string>{"DON", "'T", " stop", " ", "123", "45", "\n\n", " ", " x"});
  }
  SECTION("a literal pattern with behavior Removed drops the matches") {
    auto r = RegexSplitter::Compile(".", true, RegexSplitter::Behavior::kRemoved, "f");
    REQUIRE(r.ok());
    REQUIRE(Split(*r, "a.b..c.") == std::vector<std::string>{"a", "b", "c"});
  }
}

TEST_CASE("GPT-2's byte map covers every byte", "[model]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string piece = ByteLevelPiece(all);
  std::string back;
  REQUIRE(ByteLevelBytes(piece, &back));
  REQUIRE(back == all);
  REQUIRE(ByteLevelPiece(" \n\t!~\xA1\xFF") == "ĠĊĉ!~¡ÿ");
  REQUIRE(ByteLevelPiece("\xAD") == "Ń");
  REQUIRE_FALSE(ByteLevelBytes("日本", &back));
}

TEST_CASE("Encoding from many threads at once gives the same ids", "[model]") {
  auto t = LoadOrDie(testing::TinyBpeTokenizerJson());
  const std::vector<std::string> texts = {"hello world aaa", "help helo hell hello",
                                          "<|end|> \xF0\x9F\x98\x80 wor wor",
                                          std::string(200, 'a') + " xyz"};
  std::vector<Ids> want;
  for (const auto& s : texts) want.push_back(t->Encode(s, true));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 500; ++i) {
        const size_t n = (i + k) % texts.size();
        if (t->Encode(texts[n], true) != want[n]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(mismatches == 0);
}

}  // namespace
}  // namespace kvserve
