#include "server/http/http_service.h"

#include <httplib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "spdlog/spdlog.h"
#include "tests/server/fake_engine.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

struct Daemonette {
  explicit Daemonette(bool ready = true, std::string api_key = "",
                      ChatTemplate chat_template = ChatTemplate())
      : state(&metrics, std::move(chat_template), api_key) {
    HttpService::Options o;
    o.port = 0;
    o.max_body_bytes = 4096;
    o.threads = 16;
    http = std::make_unique<HttpService>(&state, o);
    spdlog::set_level(spdlog::level::warn);
    REQUIRE(http->Start().ok());
    if (ready) MakeReady();
  }
  ~Daemonette() { http->Stop(); }
  void MakeReady() {
    ServedModelInfo info;
    info.name = "fake";
    info.max_model_len = 256;
    state.SetReady(&engine, info);
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", http->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  httplib::Result Post(const std::string& path, const std::string& body,
                       httplib::Headers headers = {}) {
    return Client().Post(path.c_str(), headers, body, "application/json");
  }

  ServerMetrics metrics;
  ServingState state;
  testing::FakeEngine engine;
  std::unique_ptr<HttpService> http;
};

// The "data: " payloads of an SSE body; *done when it ends with [DONE].
std::vector<json> SseEvents(const std::string& body, bool* done) {
  std::vector<json> events;
  *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    std::string line = body.substr(pos, end - pos);
    REQUIRE(line.rfind("data: ", 0) == 0);
    if (line == "data: [DONE]") {
      REQUIRE(end + 2 == body.size());
      *done = true;
    } else {
      events.push_back(json::parse(line.substr(6)));
    }
    pos = end + 2;
  }
  return events;
}

void RequireError(const httplib::Result& r, int status, const std::string& param) {
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == status);
  json body = json::parse(r->body);
  REQUIRE(body["error"]["message"].is_string());
  REQUIRE(body["error"]["type"].is_string());
  if (param.empty()) {
    REQUIRE(body["error"]["param"].is_null());
  } else {
    REQUIRE(body["error"]["param"] == param);
  }
}

TEST_CASE("Readiness follows loading, ready and draining", "[server]") {
  Daemonette d(/*ready=*/false);
  auto c = d.Client();
  SECTION("loading: health and generation are 503, metrics still served") {
    auto h = c.Get("/health");
    REQUIRE(h->status == 503);
    REQUIRE(json::parse(h->body)["status"] == "loading");
    auto r = d.Post("/v1/completions", R"({"prompt": "hi"})");
    RequireError(r, 503, "");
    REQUIRE(json::parse(r->body)["error"]["code"] == "loading");
    auto m = c.Get("/metrics");
    REQUIRE(m->status == 200);
    REQUIRE(m->body.find("kvserve_ready 0") != std::string::npos);
  }
  SECTION("ready, then draining") {
    d.MakeReady();
    REQUIRE(c.Get("/health")->status == 200);
    REQUIRE(c.Get("/metrics")->body.find("kvserve_ready 1") != std::string::npos);
    d.state.StartDraining();
    auto h = c.Get("/health");
    REQUIRE(h->status == 503);
    REQUIRE(json::parse(h->body)["status"] == "draining");
    auto r = d.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}]})");
    RequireError(r, 503, "");
    REQUIRE(json::parse(r->body)["error"]["code"] == "draining");
  }
}

TEST_CASE("Once the engine gate is closed, generation and tokenize answer 503 on an open port",
          "[server]") {
  Daemonette d;
  REQUIRE(d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})")->status == 200);
  // What the daemon does before destroying the engine (gRPC's StopServing
  // closes the same gate).
  REQUIRE(d.state.gate().Close(absl::Now() + absl::Seconds(10)));
  RequireError(d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})"), 503, "");
  RequireError(d.Post("/tokenize", R"({"prompt": "hi"})"), 503, "");
  auto m = d.Client().Get("/metrics");
  REQUIRE(m);
  REQUIRE(m->status == 200);
}

TEST_CASE("POST /v1/completions returns an OpenAI completion", "[server]") {
  Daemonette d;
  auto r = d.Post("/v1/completions", R"({"model": "fake", "prompt": "hi", "max_tokens": 5})",
                  {{"X-Request-Id", "req-42"}});
  REQUIRE(r);
  REQUIRE(r->status == 200);
  REQUIRE(r->get_header_value("X-Request-Id") == "req-42");
  json j = json::parse(r->body);
  REQUIRE(j["id"] == "cmpl-req-42");
  REQUIRE(j["object"] == "text_completion");
  REQUIRE(j["model"] == "fake");
  REQUIRE(j["choices"][0]["text"] == "abcde");
  REQUIRE(j["choices"][0]["finish_reason"] == "length");
  REQUIRE(j["usage"]["prompt_tokens"] == 3);
  REQUIRE(j["usage"]["completion_tokens"] == 5);
  REQUIRE(d.engine.last_request().request_id == "req-42");
  REQUIRE(d.engine.last_request().prompt_token_ids == std::vector<int32_t>{1, 3 + 'h', 3 + 'i'});
  REQUIRE(d.state.calls_in_flight() == 0);
}

TEST_CASE("stream: true sends SSE chunks that add up to the text, then [DONE]", "[server]") {
  Daemonette d;
  SECTION("completions, with the usage chunk") {
    auto r = d.Post("/v1/completions",
                    R"({"prompt": "hi", "max_tokens": 30, "stream": true,
                        "stream_options": {"include_usage": true}})");
    REQUIRE(r->status == 200);
    REQUIRE(r->get_header_value("Content-Type") == "text/event-stream");
    bool done;
    std::vector<json> ev = SseEvents(r->body, &done);
    REQUIRE(done);
    std::string text;
    for (size_t i = 0; i + 1 < ev.size(); ++i)
      text += ev[i]["choices"][0]["text"].get<std::string>();
    REQUIRE(text == "abcdefghijklmnopqrstuvwxyz");
    REQUIRE(ev[ev.size() - 2]["choices"][0]["finish_reason"] == "stop");
    REQUIRE(ev.back()["choices"].empty());
    REQUIRE(ev.back()["usage"]["completion_tokens"] == 26);
  }
  SECTION("chat") {
    auto r = d.Post("/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                        "stream": true})");
    REQUIRE(r->status == 200);
    bool done;
    std::vector<json> ev = SseEvents(r->body, &done);
    REQUIRE(done);
    REQUIRE(ev.front()["choices"][0]["delta"]["role"] == "assistant");
    std::string text;
    for (const json& e : ev) {
      const json& delta = e["choices"][0]["delta"];
      if (delta.contains("content")) text += delta["content"].get<std::string>();
    }
    REQUIRE(text == "abc");
    REQUIRE(ev.back()["choices"][0]["finish_reason"] == "length");
  }
}

TEST_CASE("POST /v1/chat/completions and GET /v1/models", "[server]") {
  Daemonette d;
  auto r = d.Post("/v1/chat/completions",
                  R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "n": 2})");
  REQUIRE(r->status == 200);
  json j = json::parse(r->body);
  REQUIRE(j["object"] == "chat.completion");
  REQUIRE(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  REQUIRE(j["choices"].size() == 2);
  REQUIRE(j["choices"][1]["message"] == json{{"role", "assistant"}, {"content", "abcd"}});
  auto m = d.Client().Get("/v1/models");
  REQUIRE(m->status == 200);
  json models = json::parse(m->body);
  REQUIRE(models["object"] == "list");
  REQUIRE(models["data"][0]["id"] == "fake");
  REQUIRE(models["data"][0]["max_model_len"] == 256);
}

TEST_CASE("POST /tokenize and /detokenize answer in vLLM's shapes", "[server]") {
  Daemonette d;
  auto r = d.Post("/tokenize", R"({"model": "fake", "prompt": "hi"})");
  REQUIRE(r->status == 200);
  // Byte-level: BOS then 3 + each byte.
  CHECK(json::parse(r->body) == json{{"count", 3},
                                     {"max_model_len", 256},
                                     {"tokens", {1, 3 + 'h', 3 + 'i'}},
                                     {"token_strs", nullptr}});
  r = d.Post("/tokenize", R"({"prompt": "hi", "add_special_tokens": false})");
  CHECK(json::parse(r->body)["tokens"] == json{3 + 'h', 3 + 'i'});
  // Messages render with the chat template, as /v1/chat/completions does.
  r = d.Post("/tokenize", R"({"messages": [{"role": "user", "content": "x"}]})");
  REQUIRE(r->status == 200);
  const json chat = json::parse(r->body);
  CHECK(chat["count"] == chat["tokens"].size());
  CHECK(chat["count"].get<int>() > 2);
  r = d.Post("/detokenize", json{{"tokens", {3 + 'o', 3 + 'k'}}}.dump());
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body) == json{{"prompt", "ok"}});
  RequireError(d.Post("/detokenize", R"({"tokens": [4, 512]})"), 400, "tokens[1]");
  RequireError(d.Post("/tokenize", R"({"text": "x"})"), 400, "prompt");
  RequireError(d.Post("/tokenize", R"({"model": "other", "prompt": "x"})"), 404, "model");
  auto g = d.Client().Get("/tokenize");
  REQUIRE(g->status == 405);
  CHECK(g->get_header_value("Allow") == "POST");
}

TEST_CASE("Bad requests get the right status and a JSON body, and serving goes on", "[server]") {
  Daemonette d;
  SECTION("400 naming the field") {
    RequireError(d.Post("/v1/completions", R"({"prompt": "hi", "temperature": -1})"), 400,
                 "temperature");
    RequireError(d.Post("/v1/completions", R"({"prompt": "hi", "top_p": 2})"), 400, "top_p");
    RequireError(d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 0})"), 400,
                 "max_tokens");
    RequireError(d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 500})"), 400,
                 "max_tokens");
    RequireError(d.Post("/v1/completions", "{not json"), 400, "");
    RequireError(d.Post("/v1/chat/completions", R"({"messages": 1})"), 400, "messages");
  }
  SECTION("engine refusals map through") {
    RequireError(d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 77})"), 400,
                 "max_tokens");
    d.engine.queue_full = true;
    auto r = d.Post("/v1/completions", R"({"prompt": "hi"})");
    RequireError(r, 429, "");
    REQUIRE(json::parse(r->body)["error"]["code"] == "queue_full");
    d.engine.queue_full = false;
  }
  SECTION("unknown model and path are 404, oversized bodies 413") {
    RequireError(d.Post("/v1/completions", R"({"model": "gpt-4", "prompt": "hi"})"), 404, "model");
    RequireError(d.Post("/v1/nothing", "{}"), 404, "");
    // A route with the wrong method: 405 naming the method it takes.
    auto get = d.Client().Get("/v1/completions");
    RequireError(get, 405, "");
    REQUIRE(get->get_header_value("Allow") == "POST");
    REQUIRE(json::parse(get->body)["error"]["message"] ==
            "GET is not allowed on /v1/completions: use POST");
    auto post = d.Post("/health", "{}");
    RequireError(post, 405, "");
    REQUIRE(post->get_header_value("Allow") == "GET");
    auto big = d.Post("/v1/completions", R"({"prompt": ")" + std::string(8000, 'x') + R"("})");
    RequireError(big, 413, "");
    REQUIRE(json::parse(big->body)["error"]["code"] == "payload_too_large");
  }
  auto ok = d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})");
  REQUIRE(ok->status == 200);
  REQUIRE(json::parse(ok->body)["choices"][0]["text"] == "ab");
  // A response is counted before its first byte is sent.
  const std::string metrics = d.Client().Get("/metrics")->body;
  REQUIRE(metrics.find("kvserve_http_responses_total{code=\"200\"} 1\n") != std::string::npos);
}

TEST_CASE("A checkpoint chat template's refusal is a 400 naming messages", "[server]") {
  // Gemma-3's rule: roles alternate user/assistant, in the template's words.
  absl::StatusOr<std::optional<HfChatTemplate>> hf = HfChatTemplate::FromConfig(
      R"({"bos_token": "<bos>", "chat_template": "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}"})",
      "", "test");
  REQUIRE(hf.ok());
  Daemonette d(/*ready=*/true, "", ChatTemplate::FromCheckpoint(**hf));
  for (const char* stream : {"false", "true"}) {
    auto r = d.Post(
        "/v1/chat/completions",
        std::string(
            R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "stream": )") +
            stream + "}");
    RequireError(r, 400, "messages");
    REQUIRE(json::parse(r->body)["error"]["message"] ==
            "'messages' cannot be rendered with the model's chat template: Conversation roles must "
            "alternate user/assistant/user/assistant/...");
  }
  auto ok = d.Post(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "c"}], "max_tokens": 2})");
  REQUIRE(ok->status == 200);
  std::vector<int32_t> expected;  // the byte-level fake tokenizer, no BOS added
  for (unsigned char c : std::string("<bos><user>a<assistant>b<user>c")) expected.push_back(3 + c);
  REQUIRE(d.engine.last_request().prompt_token_ids == expected);
}

TEST_CASE("With server.api_key, /v1 needs the bearer key but /health does not", "[server]") {
  Daemonette d(/*ready=*/true, "s3cret");
  RequireError(d.Post("/v1/completions", R"({"prompt": "hi"})"), 401, "");
  RequireError(d.Post("/v1/completions", R"({"prompt": "hi"})", {{"Authorization", "Bearer nope"}}),
               401, "");
  REQUIRE(d.Client().Get("/health")->status == 200);
  auto r = d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 1})",
                  {{"Authorization", "Bearer s3cret"}});
  REQUIRE(r->status == 200);
}

TEST_CASE("A client leaving mid-stream cancels its request", "[server]") {
  Daemonette d;
  d.engine.reply_length = 1 << 30;
  d.engine.token_interval = absl::Milliseconds(1);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": "hi", "max_tokens": 200, "stream": true})";
  req.set_header("Content-Type", "application/json");
  std::string received;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    received.append(data, len);
    return received.find("\n\n") == std::string::npos;  // leave after the first event
  };
  auto client = d.Client();
  auto r = client.send(req);
  REQUIRE(received.rfind("data: {", 0) == 0);
  client.stop();
  REQUIRE(d.engine.WaitForCancelled(1) == 1);
  REQUIRE(d.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
  // And the server still serves.
  d.engine.reply_length = 26;
  d.engine.token_interval = absl::ZeroDuration();
  REQUIRE(d.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})")->status == 200);
}

}  // namespace
}  // namespace kvserve
