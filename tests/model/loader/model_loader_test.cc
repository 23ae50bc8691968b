#include "model/loader/model_loader.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "model/loader/hf_writer.h"
#include "model/loader/llama2c_loader.h"
#include "tests/model/tiny_bpe.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {
namespace fs = std::filesystem;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST_CASE("LoadModel dispatches on what the path is", "[model]") {
  SECTION("a llama2.c checkpoint finds the tokenizer beside it") {
    auto m = LoadModel(testing::Stories260kCheckpoint());
    REQUIRE(m.ok());
    REQUIRE(m->weights.config.name == "stories260K");
    REQUIRE(m->weights.config.rope_style == RopeStyle::kInterleaved);
    REQUIRE(m->weights.config.bos_is_stop);
    REQUIRE(m->tokenizer->vocab_size() == 512);
    REQUIRE(m->tokenizer->Decode(m->tokenizer->Encode("Once upon a time", true)) ==
            "Once upon a time");
  }
  SECTION("a converted HF directory uses its tokenizer.model") {
    auto ref = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
    REQUIRE(ref.ok());
    const std::string dir = testing::MakeTempDir("loader-hf") + "/stories260k-hf";
    REQUIRE(WriteHfDirectory(*ref, testing::Stories260kTokenizer(), dir).ok());
    auto m = LoadModel(dir);
    REQUIRE(m.ok());
    REQUIRE(m->weights.config.name == "stories260k-hf");
    REQUIRE(m->weights.config.rope_style == RopeStyle::kNeox);
    REQUIRE(m->weights.config.bos_is_stop);  // from "kvserve_bos_is_stop"
    REQUIRE(m->tokenizer->vocab_size() == 512);

    SECTION("and fails clearly when tokenizer.model is gone") {
      fs::remove(dir + "/tokenizer.model");
      auto missing = LoadModel(dir);
      REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
      REQUIRE(std::string(missing.status().message()) ==
              dir +
                  ": no tokenizer.json or tokenizer.model in the HF directory; pass "
                  "--tokenizer FILE");
      REQUIRE(LoadModel(dir, testing::Stories260kTokenizer()).ok());
    }
  }
  SECTION("an HF directory with tokenizer.json gets byte-level BPE and all its stop ids") {
    auto ref = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
    REQUIRE(ref.ok());
    const std::string dir = testing::MakeTempDir("loader-bpe") + "/bpe-hf";
    REQUIRE(WriteHfDirectory(*ref, testing::Stories260kTokenizer(), dir).ok());
    testing::WriteJson(dir, "tokenizer.json", testing::TinyBpeTokenizerJson());
    testing::WriteJson(dir, "tokenizer_config.json", testing::TinyBpeTokenizerConfig());
    testing::WriteJson(dir, "generation_config.json",
                       {{"eos_token_id", {2, 300}}, {"temperature", 0.7}});
    auto m = LoadModel(dir);
    REQUIRE(m.ok());
    REQUIRE(m->tokenizer->vocab_size() == 304);
    REQUIRE(m->tokenizer->Encode("hello world", true) ==
            std::vector<int32_t>{300, 259, 262, 108, 100});
    REQUIRE(m->special_tokens.bos_token == "<|begin|>");
    REQUIRE(m->special_tokens.eos_token == "<|end|>");
    const ModelConfig& c = m->weights.config;
    REQUIRE(c.eos_id == 2);  // config.json's
    // generation_config.json's list, then the tokenizer's <|end|>.
    REQUIRE(c.stop_ids == std::vector<int32_t>{300, 301});
    REQUIRE(c.default_temperature == 0.7f);

    SECTION("and an explicit --tokenizer still wins") {
      auto sp = LoadModel(dir, testing::Stories260kTokenizer());
      REQUIRE(sp.ok());
      REQUIRE(sp->tokenizer->vocab_size() == 512);
      REQUIRE(sp->special_tokens.eos_token == "</s>");
      REQUIRE(sp->weights.config.stop_ids == std::vector<int32_t>{300});
    }
  }
  SECTION("dummy:tiny gets a byte-level tokenizer unless one is given") {
    auto m = LoadModel("dummy:tiny");
    REQUIRE(m.ok());
    REQUIRE(m->weights.config.name == "tiny");
    REQUIRE(m->weights.config.vocab_size == 512);
    REQUIRE(m->tokenizer->vocab_size() == 512);
    REQUIRE(m->tokenizer->Encode("hi", true) == std::vector<int32_t>{1, 3 + 'h', 3 + 'i'});

    auto sp = LoadModel("dummy:tiny", testing::Stories260kTokenizer());
    REQUIRE(sp.ok());
    // A real SentencePiece vocabulary, not bytes.
    REQUIRE(sp->tokenizer->Encode("Once", false) != m->tokenizer->Encode("Once", false));
  }
  SECTION("a path that does not exist is NotFound naming it") {
    auto m = LoadModel("no/such/model.bin");
    REQUIRE(m.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(m.status(), "no/such/model.bin: no such model"));
  }
  SECTION("an unknown dummy preset lists the known ones") {
    auto m = LoadModel("dummy:nope");
    REQUIRE(m.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(m.status(),
                     "known presets: tiny, llama-2-7b, llama-2-70b, llama-3-8b, "
                     "mistral-7b"));
  }
  SECTION("a checkpoint with no tokenizer beside it asks for --tokenizer") {
    const std::string dir = testing::MakeTempDir("loader-lonely");
    const std::string ckpt = dir + "/lonely.bin";
    fs::copy_file(testing::Stories260kCheckpoint(), ckpt);
    auto m = LoadModel(ckpt);
    REQUIRE(m.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(m.status(), ckpt + ": no tokenizer given and no *.model file beside the "
                                        "checkpoint; pass --tokenizer FILE"));
    auto bad_tok = LoadModel(ckpt, dir + "/missing.model");
    REQUIRE(bad_tok.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(bad_tok.status(), dir + "/missing.model"));
    REQUIRE(LoadModel(ckpt, testing::Stories260kTokenizer()).ok());
  }
}

}  // namespace
}  // namespace kvserve
