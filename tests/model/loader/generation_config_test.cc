#include "model/loader/generation_config.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "tests/test_util.h"

namespace kvserve {
namespace {

std::string Write(const std::string& text) {
  const std::string path = testing::MakeTempDir("gen-config") + "/generation_config.json";
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("generation_config.json adds stop ids and sampling defaults", "[model]") {
  ModelConfig c;
  c.eos_id = 128001;
  SECTION("Llama 3.1 Instruct: an eos list, temperature and top_p") {
    REQUIRE(ApplyGenerationConfig(Write(R"({"bos_token_id": 128000, "do_sample": true,
        "eos_token_id": [128001, 128008, 128009], "temperature": 0.6, "top_p": 0.9,
        "transformers_version": "4.42.3"})"),
                                  &c)
                .ok());
    REQUIRE(c.eos_id == 128001);
    REQUIRE(c.stop_ids == std::vector<int32_t>{128008, 128009});
    REQUIRE(c.IsStopToken(128001));
    REQUIRE(c.IsStopToken(128009));
    REQUIRE_FALSE(c.IsStopToken(128000));
    REQUIRE(c.default_temperature == 0.6f);
    REQUIRE(c.default_top_p == 0.9f);
    REQUIRE_FALSE(c.default_top_k.has_value());
  }
  SECTION("Qwen 3: top_k too; ids already known are not repeated") {
    c.stop_ids = {151643};
    REQUIRE(ApplyGenerationConfig(Write(R"({"eos_token_id": [151645, 151643], "top_k": 20,
        "top_p": 0.95, "temperature": 0.6})"),
                                  &c)
                .ok());
    REQUIRE(c.stop_ids == std::vector<int32_t>{151643, 151645});
    REQUIRE(c.default_top_k == 20);
  }
  SECTION("a single id, and nothing else") {
    REQUIRE(ApplyGenerationConfig(Write(R"({"eos_token_id": 7})"), &c).ok());
    REQUIRE(c.stop_ids == std::vector<int32_t>{7});
    REQUIRE_FALSE(c.default_temperature.has_value());
    REQUIRE_FALSE(c.default_top_p.has_value());
  }
  SECTION("bad values are InvalidArgument naming the file and field") {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"eos_token_id": [1, -2]})", "field 'eos_token_id' is not a token id"},
        {R"({"eos_token_id": "x"})", "field 'eos_token_id' is not a token id"},
        {R"({"temperature": -1})", "field 'temperature' must be a number >= 0, got -1"},
        {R"({"top_p": 0})", "field 'top_p' must be a number in (0, 1], got 0"},
        {R"({"top_k": 1.5})", "field 'top_k' must be an integer >= -1, got 1.5"},
        {R"([1])", "not a JSON object"},
        {R"({"eos_token_id": )", "not valid JSON"},
    };
    for (const auto& [text, want] : cases) {
      INFO(text);
      const std::string path = Write(text);
      absl::Status s = ApplyGenerationConfig(path, &c);
      REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(std::string(s.message()).find(path + ": ") == 0);
      REQUIRE(std::string(s.message()).find(want) != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kvserve
