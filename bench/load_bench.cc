// load_bench: a closed-loop load generator for a running kvserve daemon.
// `concurrency` clients each send streaming /v1/completions requests back to
// back until `requests` have been sent, and the run reports what users feel
// (time to first token, time per output token, end-to-end latency, as
// percentiles) and what the operator pays for (requests/s, output tokens/s).
//
//   build/bench/load_bench --url http://127.0.0.1:8000 --concurrency 32 --requests 256
//       --max-tokens 128 --json load.json
//
// Token counts come from the stream's usage chunk (stream_options.include_usage).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8000;
  int concurrency = 8;
  int requests = 64;
  int max_tokens = 128;
  double temperature = 0.8;
  std::string prompt = "Once upon a time";
  std::string model;  // "" = whatever the server serves
  std::string json_path;
};

struct Sample {
  bool ok = false;
  double ttft_s = 0;
  double e2e_s = 0;
  int completion_tokens = 0;
};

constexpr char kUsage[] =
    "usage: load_bench [--url http://HOST:PORT] [--concurrency N] [--requests N]\n"
    "                  [--max-tokens N] [--temperature T] [--prompt TEXT] [--model NAME]\n"
    "                  [--json FILE]\n";

bool ParseUrl(const std::string& url, Options* o) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    o->host = rest;
    return !rest.empty();
  }
  o->host = rest.substr(0, colon);
  o->port = std::atoi(rest.c_str() + colon + 1);
  return !o->host.empty() && o->port > 0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

Sample RunOne(const Options& o, int index) {
  json body = {{"prompt", o.prompt},
               {"max_tokens", o.max_tokens},
               {"temperature", o.temperature},
               {"seed", index},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (!o.model.empty()) body["model"] = o.model;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");

  Sample s;
  const Clock::time_point start = Clock::now();
  std::string buffer;
  bool done = false;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json chunk = json::parse(payload, nullptr, /*allow_exceptions=*/false);
      if (chunk.is_discarded()) continue;
      if (s.ttft_s == 0 && chunk.contains("choices") && !chunk["choices"].empty() &&
          !chunk["choices"][0].value("text", "").empty()) {
        s.ttft_s = std::chrono::duration<double>(Clock::now() - start).count();
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        s.completion_tokens = chunk["usage"].value("completion_tokens", 0);
      }
    }
    return true;
  };
  httplib::Client client(o.host, o.port);
  client.set_read_timeout(600, 0);
  client.set_connection_timeout(30, 0);
  auto r = client.send(req);
  s.e2e_s = std::chrono::duration<double>(Clock::now() - start).count();
  s.ok = r && r->status == 200 && done;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "load_bench: %s needs a value\n%s", a.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--url") {
      if (!ParseUrl(next(), &o)) {
        std::fprintf(stderr, "load_bench: bad --url\n");
        return 2;
      }
    } else if (a == "--concurrency") {
      o.concurrency = std::atoi(next().c_str());
    } else if (a == "--requests") {
      o.requests = std::atoi(next().c_str());
    } else if (a == "--max-tokens") {
      o.max_tokens = std::atoi(next().c_str());
    } else if (a == "--temperature") {
      o.temperature = std::atof(next().c_str());
    } else if (a == "--prompt") {
      o.prompt = next();
    } else if (a == "--model") {
      o.model = next();
    } else if (a == "--json") {
      o.json_path = next();
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "load_bench: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (o.concurrency < 1 || o.requests < 1 || o.max_tokens < 1) {
    std::fprintf(stderr, "load_bench: --concurrency, --requests and --max-tokens must be >= 1\n");
    return 2;
  }

  std::atomic<int> next_index{0};
  std::mutex mu;
  std::vector<Sample> samples;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < o.concurrency; ++w) {
    workers.emplace_back([&] {
      for (int i = next_index++; i < o.requests; i = next_index++) {
        Sample s = RunOne(o, i);
        std::lock_guard<std::mutex> lock(mu);
        samples.push_back(s);
      }
    });
  }
  for (auto& t : workers) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, e2e, tpot;
  int ok = 0;
  int64_t tokens = 0;
  for (const Sample& s : samples) {
    if (!s.ok) continue;
    ++ok;
    tokens += s.completion_tokens;
    ttft.push_back(s.ttft_s);
    e2e.push_back(s.e2e_s);
    if (s.completion_tokens > 1) tpot.push_back((s.e2e_s - s.ttft_s) / (s.completion_tokens - 1));
  }
  json result = {
      {"url", "http://" + o.host + ":" + std::to_string(o.port)},
      {"concurrency", o.concurrency},
      {"requests", o.requests},
      {"succeeded", ok},
      {"failed", o.requests - ok},
      {"max_tokens", o.max_tokens},
      {"wall_s", wall},
      {"requests_per_s", ok / wall},
      {"output_tokens", tokens},
      {"output_tokens_per_s", static_cast<double>(tokens) / wall},
      {"ttft_s",
       {{"p50", Percentile(ttft, 0.5)},
        {"p90", Percentile(ttft, 0.9)},
        {"p99", Percentile(ttft, 0.99)}}},
      {"tpot_s",
       {{"p50", Percentile(tpot, 0.5)},
        {"p90", Percentile(tpot, 0.9)},
        {"p99", Percentile(tpot, 0.99)}}},
      {"e2e_s",
       {{"p50", Percentile(e2e, 0.5)},
        {"p90", Percentile(e2e, 0.9)},
        {"p99", Percentile(e2e, 0.99)}}},
  };
  std::printf(
      "%d/%d requests ok in %.2fs: %.1f req/s, %.0f output tok/s\n"
      "TTFT p50 %.1f ms p90 %.1f ms p99 %.1f ms | TPOT p50 %.2f ms p90 %.2f ms | "
      "e2e p50 %.0f ms p99 %.0f ms\n",
      ok, o.requests, wall, ok / wall, static_cast<double>(tokens) / wall,
      1e3 * Percentile(ttft, 0.5), 1e3 * Percentile(ttft, 0.9), 1e3 * Percentile(ttft, 0.99),
      1e3 * Percentile(tpot, 0.5), 1e3 * Percentile(tpot, 0.9), 1e3 * Percentile(e2e, 0.5),
      1e3 * Percentile(e2e, 0.99));
  if (!o.json_path.empty()) std::ofstream(o.json_path) << result.dump(2) << "\n";
  return ok == o.requests ? 0 : 1;
}
