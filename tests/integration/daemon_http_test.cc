// The daemon's OpenAI-compatible HTTP API end to end, through the real
// `kvserve serve` binary on loopback ports: the greedy reference text plain
// and streamed, errors with their codes and JSON bodies (the daemon serving
// on after each), 32 concurrent streams with half the clients leaving, the
// Prometheus exposition, and a graceful SIGTERM.
//
// llama2.c's run.c samples a token at every position 0..255 from [BOS], so
// the reference text is 256 greedy tokens from an empty prompt.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;

constexpr char kGreedyBody[] = R"({"model": "stories260k", "prompt": "", "max_tokens": 256,
                                   "temperature": 0})";

httplib::Result PostJson(const DaemonProcess& d, const std::string& path, const std::string& body) {
  return d.Client().Post(path.c_str(), body, "application/json");
}

std::string CompletionText(const httplib::Result& r) {
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

// Concatenated choice texts of a completions SSE body; *done when it ended
// with [DONE].
std::string StreamedText(const std::string& body, bool* done, std::string* finish = nullptr) {
  std::string text;
  *done = false;
  for (const std::string& data : testing::SseData(body)) {
    if (data == "[DONE]") {
      *done = true;
      continue;
    }
    json chunk = json::parse(data);
    if (chunk["choices"].empty()) continue;
    text += chunk["choices"][0]["text"].get<std::string>();
    if (finish != nullptr && !chunk["choices"][0]["finish_reason"].is_null()) {
      *finish = chunk["choices"][0]["finish_reason"].get<std::string>();
    }
  }
  return text;
}

// The sample value of `series` in a Prometheus text exposition.
double MetricValue(const std::string& text, const std::string& series) {
  size_t pos = text.find("\n" + series + " ");
  REQUIRE(pos != std::string::npos);
  pos += series.size() + 2;
  return std::stod(text.substr(pos, text.find('\n', pos) - pos));
}

// grpc.health.v1.Health/Watch (hand-encoded: Debian ships no health stubs)
// until the daemon reports NOT_SERVING; false if the stream ends first.
bool WatchUntilNotServing(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::Slice empty(std::string{});  // the empty HealthCheckRequest: the whole server
  grpc::ByteBuffer request(&empty, 1);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channel.get(),
          grpc::internal::RpcMethod("/grpc.health.v1.Health/Watch",
                                    grpc::internal::RpcMethod::SERVER_STREAMING),
          &ctx, request));
  grpc::ByteBuffer reply;
  while (reader->Read(&reply)) {
    std::vector<grpc::Slice> slices;
    reply.Dump(&slices);
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    if (bytes == std::string("\x08\x02", 2)) return true;  // status: NOT_SERVING
  }
  return false;
}

void RequireApiError(const httplib::Result& r, int status, const std::string& param) {
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == status);
  json e = json::parse(r->body)["error"];
  REQUIRE(e["message"].is_string());
  REQUIRE(e["type"].is_string());
  if (param.empty()) {
    REQUIRE(e["param"].is_null());
  } else {
    REQUIRE(e["param"] == param);
  }
}

TEST_CASE("Daemon: /v1/completions at temperature 0 returns the reference text", "[integration]") {
  DaemonProcess d;
  const std::string golden = testing::GoldenGreedyText();
  SECTION("as one JSON completion") {
    auto r = PostJson(d, "/v1/completions", kGreedyBody);
    REQUIRE(CompletionText(r) == golden);
    json j = json::parse(r->body);
    REQUIRE(j["object"] == "text_completion");
    REQUIRE(j["model"] == "stories260k");
    REQUIRE(j["choices"][0]["finish_reason"] == "length");
    REQUIRE(j["usage"]["prompt_tokens"] == 1);
    REQUIRE(j["usage"]["completion_tokens"] == 256);
  }
  SECTION("as SSE chunks that concatenate to it and end with [DONE]") {
    json body = json::parse(kGreedyBody);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto r = PostJson(d, "/v1/completions", body.dump());
    REQUIRE(r);
    REQUIRE(r->status == 200);
    REQUIRE(r->get_header_value("Content-Type") == "text/event-stream");
    std::vector<std::string> data = testing::SseData(r->body);
    REQUIRE(data.size() > 10);  // streamed, not one blob
    REQUIRE(data.back() == "[DONE]");
    bool done;
    std::string finish;
    REQUIRE(StreamedText(r->body, &done, &finish) == golden);
    REQUIRE(done);
    REQUIRE(finish == "length");
    json usage = json::parse(data[data.size() - 2])["usage"];
    REQUIRE(usage["completion_tokens"] == 256);
  }
  SECTION("chat completions answer through the plain template, streamed the same") {
    const std::string chat =
        R"({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 48,
            "temperature": 0)";
    auto plain = PostJson(d, "/v1/chat/completions", chat + "}");
    REQUIRE(plain->status == 200);
    json j = json::parse(plain->body);
    const std::string content = j["choices"][0]["message"]["content"].get<std::string>();
    REQUIRE_FALSE(content.empty());
    REQUIRE(j["usage"]["completion_tokens"].get<int>() <= 48);
    auto streamed = PostJson(d, "/v1/chat/completions", chat + R"(, "stream": true})");
    std::string text;
    std::vector<std::string> data = testing::SseData(streamed->body);
    REQUIRE(data.back() == "[DONE]");
    for (size_t i = 0; i + 1 < data.size(); ++i) {
      json delta = json::parse(data[i])["choices"][0]["delta"];
      if (delta.contains("content")) text += delta["content"].get<std::string>();
    }
    REQUIRE(text == content);
  }
  SECTION("GET /v1/models names the served model") {
    auto r = d.Client().Get("/v1/models");
    REQUIRE(r->status == 200);
    REQUIRE(json::parse(r->body)["data"][0]["id"] == "stories260k");
    REQUIRE(json::parse(r->body)["data"][0]["max_model_len"] == 512);
  }
}

TEST_CASE("Daemon: bad requests get their status and a JSON body naming the field",
          "[integration]") {
  DaemonProcess d({"server.max_body_bytes=64KiB"});
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;
  };
  const std::string c = "/v1/completions";
  std::string long_prompt;  // well over 512 tokens
  for (int i = 0; i < 200; ++i) long_prompt += "Once upon a time, there was a girl. ";
  const Case cases[] = {
      {"/v1/completions", R"({"prompt": "x", "temperature": -1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "x", "temperature": "warm"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 1.01})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 600})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": ")" + long_prompt + R"("})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "x", "n": 0})", 400, "n"},
      {"/v1/completions", R"({"prompt": "x", "stop": 3})", 400, "stop"},
      {"/v1/completions", "{\"prompt\": \"x\"", 400, ""},
      {"/v1/completions", "[]", 400, ""},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}], "logprobs": "yes"})", 400,
       "logprobs"},
      {"/v1/completions", R"({"model": "gpt-4o", "prompt": "x"})", 404, "model"},
      {"/v1/nowhere", "{}", 404, ""},
      {"/v1/completions", R"({"prompt": ")" + std::string(100 * 1024, 'a') + R"("})", 413, ""},
  };
  for (const Case& k : cases) {
    INFO(k.path << " " << k.body.substr(0, 120));
    RequireApiError(PostJson(d, k.path, k.body), k.status, k.param);
    // The daemon serves on after every one.
    REQUIRE(d.Client().Get("/health")->status == 200);
  }
  REQUIRE(CompletionText(PostJson(d, c, kGreedyBody)) == testing::GoldenGreedyText());
}

TEST_CASE("Daemon: a full queue answers 429 and the daemon serves on", "[integration]") {
  // One running sequence and one waiting request at most: of many long
  // requests sent at once, the rest are refused.
  DaemonProcess d({"scheduler.max_num_seqs=1", "server.max_queue=1"});
  const std::string body =
      R"({"prompt": "", "max_tokens": 511, "temperature": 0, "ignore_eos": true})";
  constexpr int kClients = 16;
  std::vector<std::future<std::pair<int, std::string>>> results;
  for (int i = 0; i < kClients; ++i) {
    results.push_back(std::async(std::launch::async, [&] {
      auto r = PostJson(d, "/v1/completions", body);
      return r ? std::make_pair(r->status, r->body) : std::make_pair(-1, std::string());
    }));
  }
  int ok = 0, refused = 0;
  for (auto& f : results) {
    auto [status, text] = f.get();
    INFO(text);
    REQUIRE((status == 200 || status == 429));
    if (status == 429) {
      ++refused;
      json e = json::parse(text)["error"];
      REQUIRE(e["code"] == "queue_full");
    } else {
      ++ok;
    }
  }
  REQUIRE(ok >= 1);
  REQUIRE(refused >= 1);
  REQUIRE(CompletionText(PostJson(d, "/v1/completions", kGreedyBody)) ==
          testing::GoldenGreedyText());
}

TEST_CASE("Daemon: 32 concurrent streams, half the clients leaving, leave no KV in use",
          "[integration]") {
  DaemonProcess d;
  constexpr int kClients = 32;
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0.8, "seed": )";
  std::atomic<int> completed{0}, left{0};
  std::mutex problems_mu;
  std::string problems;
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      const bool leaves = i % 2 == 1;
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body + std::to_string(i) + R"(, "stream": true, "ignore_eos": true})";
      req.set_header("Content-Type", "application/json");
      std::string received;
      int events = 0;
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        received.append(data, len);
        events = static_cast<int>(testing::SseData(received).size());
        return !(leaves && events >= 5);  // leaving: hang up mid-stream
      };
      auto client = d.Client();
      auto r = client.send(req);
      client.stop();
      std::vector<std::string> data = testing::SseData(received);
      if (leaves && events >= 5) {
        ++left;
      } else if (!leaves && r && r->status == 200 && !data.empty() && data.back() == "[DONE]") {
        ++completed;
      } else {
        std::lock_guard<std::mutex> lock(problems_mu);
        problems += "client " + std::to_string(i) + ": " + httplib::to_string(r.error()) +
                    " status " + std::to_string(r ? r->status : -1) + ", " +
                    std::to_string(data.size()) + " events, last '" +
                    (data.empty() ? "" : data.back()) + "'\n";
      }
    });
  }
  for (auto& t : clients) t.join();
  INFO(problems);
  REQUIRE(completed == kClients / 2);
  REQUIRE(left == kClients / 2);

  // The daemon serves on...
  REQUIRE(CompletionText(PostJson(d, "/v1/completions", kGreedyBody)) ==
          testing::GoldenGreedyText());
  // ...and every block of the cancelled requests came back. A leaving
  // client's request is cancelled as its connection closes (before the
  // reference request was sent); the engine frees the blocks at its next
  // step, and the reference request ran 256 of them.
  const std::string metrics = d.Client().Get("/metrics")->body;
  INFO(metrics);
  REQUIRE(MetricValue(metrics, "kvserve_kv_usage_ratio{kind=\"active\"}") == 0);
  REQUIRE(MetricValue(metrics, "kvserve_running_sequences") == 0);
  REQUIRE(MetricValue(metrics, "kvserve_kv_blocks{state=\"active\"}") == 0);
  REQUIRE(MetricValue(metrics, "kvserve_requests_total{finish_reason=\"cancelled\"}") ==
          kClients / 2);
  REQUIRE(MetricValue(metrics, "kvserve_e2e_request_latency_seconds_count") == kClients + 1);
}

TEST_CASE("Daemon: GET /metrics passes promtool check metrics", "[integration]") {
  DaemonProcess d;
  REQUIRE(CompletionText(PostJson(d, "/v1/completions", kGreedyBody)) ==
          testing::GoldenGreedyText());
  auto r = d.Client().Get("/metrics");
  REQUIRE(r->status == 200);
  REQUIRE(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
  const std::string& text = r->body;
  for (const char* name :
       {"kvserve_requests_total", "kvserve_queue_length", "kvserve_running_sequences",
        "kvserve_kv_usage_ratio", "kvserve_kv_blocks", "kvserve_prefix_cache_queries_tokens_total",
        "kvserve_prefix_cache_hits_tokens_total", "kvserve_preemptions_total",
        "kvserve_swap_out_blocks_total", "kvserve_swap_in_blocks_total",
        "kvserve_time_to_first_token_seconds", "kvserve_time_per_output_token_seconds",
        "kvserve_e2e_request_latency_seconds", "kvserve_queue_time_seconds",
        "kvserve_prompt_tokens_total", "kvserve_generation_tokens_total"}) {
    INFO(name);
    REQUIRE(text.find(std::string("# TYPE ") + name + " ") != std::string::npos);
  }
  REQUIRE(MetricValue(text, "kvserve_requests_total{finish_reason=\"length\"}") == 1);
  REQUIRE(MetricValue(text, "kvserve_generation_tokens_total") == 256);
  // The pool as allocated: stories260K's 5 layers of fp32 blocks of 16
  // tokens (4 kv heads x head_dim 8 x 4 bytes, K and V), 64 sequences of 512.
  REQUIRE(MetricValue(text, "kvserve_kv_block_bytes") == 5 * 2 * 4 * 16 * 8 * 4);
  REQUIRE(MetricValue(text, "kvserve_kv_blocks_capacity") == 64 * 32);
  REQUIRE(MetricValue(text, "kvserve_kv_pool_tokens") == 64 * 32 * 16);
  REQUIRE(MetricValue(text, "kvserve_kv_pool_bytes") == 64 * 32 * 5 * 2 * 4 * 16 * 8 * 4);
  REQUIRE(MetricValue(text, "kvserve_model_weight_bytes") > 0);
  REQUIRE(MetricValue(text, "kvserve_time_to_first_token_seconds_count") == 1);

  std::string out;
  if (testing::RunCommand("command -v promtool", &out) != 0) {
    WARN("promtool not installed (Debian package prometheus): skipping the lint");
    return;
  }
  const std::string path = d.dir() + "/metrics.txt";
  std::ofstream(path) << text;
  out.clear();
  const int rc = testing::RunCommand("promtool check metrics < '" + path + "'", &out);
  INFO(out);
  REQUIRE(rc == 0);
}

TEST_CASE("Daemon: SIGTERM refuses new work, finishes in-flight streams and exits 0",
          "[integration]") {
  // One sequence at a time and a backlog of long streams: work still in
  // flight (running and queued) when the signal arrives.
  DaemonProcess d({"scheduler.max_num_seqs=1"});
  constexpr int kClients = 24;
  const std::string body =
      R"({"prompt": "", "max_tokens": 500, "temperature": 0, "ignore_eos": true, "stream": true})";
  std::mutex mu;
  std::condition_variable cv;
  int admitted = 0;  // clients whose response headers arrived: their request is in the engine
  std::atomic<int> finished{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body;
      req.set_header("Content-Type", "application/json");
      req.response_handler = [&](const httplib::Response&) {
        std::lock_guard<std::mutex> lock(mu);
        ++admitted;
        cv.notify_all();
        return true;
      };
      std::string received;
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        received.append(data, len);
        return true;
      };
      auto r = d.Client().send(req);
      bool done;
      std::string finish;
      StreamedText(received, &done, &finish);
      if (r && r->status == 200 && done && finish == "length") ++finished;
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return admitted == kClients; }));
  }
  // The gRPC health watch tells when the daemon began draining (it stops
  // admitting before it says NOT_SERVING).
  auto watch =
      std::async(std::launch::async, [&] { return WatchUntilNotServing(d.grpc_target()); });
  d.Signal(SIGTERM);
  REQUIRE(watch.get());

  // Draining: not ready, and new work is refused with 503.
  auto health = d.Client().Get("/health");
  REQUIRE(health);
  REQUIRE(health->status == 503);
  auto refused = PostJson(d, "/v1/completions", kGreedyBody);
  RequireApiError(refused, 503, "");
  REQUIRE(json::parse(refused->body)["error"]["code"] == "draining");

  for (auto& t : clients) t.join();
  REQUIRE(finished == kClients);
  INFO(d.Log());
  REQUIRE(d.WaitForExit(std::chrono::seconds(60)) == 0);
  REQUIRE(d.Log().find("stopped") != std::string::npos);
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

TEST_CASE("Daemon: kv_policy evicts per request and the golden text stays exact beside it",
          "[integration][eviction]") {
  DaemonProcess d({"cache.eviction_budget=64"});
  // streaming runs past the model's 512 positions.
  auto long_story = PostJson(d, "/v1/completions", R"({"prompt": "Once upon a time",
      "max_tokens": 700, "temperature": 0, "ignore_eos": true,
      "kv_policy": {"policy": "streaming", "sink_tokens": 4}})");
  REQUIRE(long_story);
  INFO(long_story->body);
  REQUIRE(long_story->status == 200);
  const json body = json::parse(long_story->body);
  REQUIRE(body["usage"]["completion_tokens"] == 700);
  REQUIRE(body["choices"][0]["finish_reason"] == "length");
  // The same daemon still gives llama2.c's reference text without eviction.
  REQUIRE(CompletionText(PostJson(d, "/v1/completions", kGreedyBody)) ==
          testing::GoldenGreedyText());
  RequireApiError(PostJson(d, "/v1/completions",
                           R"({"prompt": "a", "kv_policy": {"policy": "h2o", "budget": 1}})"),
                  400, "kv_policy.budget");
  RequireApiError(PostJson(d, "/v1/completions", R"({"prompt": "a", "kv_policy": "lru"})"), 400,
                  "kv_policy.policy");
  const std::string metrics = d.Client().Get("/metrics")->body;
  REQUIRE(MetricValue(metrics, "kvserve_kv_evictions_total{policy=\"streaming\"}") > 600);
  REQUIRE(MetricValue(metrics, "kvserve_kv_evicted_tokens_total{policy=\"streaming\"}") > 600);
  REQUIRE(MetricValue(metrics, "kvserve_kv_evictions_total{policy=\"h2o\"}") == 0);
}

}  // namespace
}  // namespace kvserve
