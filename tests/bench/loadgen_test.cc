// The serving benchmark's pieces without a server: percentiles, the SSE
// parser and chunk reader, request bodies, the Prometheus reader against the
// daemon's own /metrics text, workloads built from the dev-set text with the
// stories260K tokenizer, Poisson arrivals, and the load runner with a fake
// client.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/synchronization/mutex.h"
#include "bench/loadgen/client.h"
#include "bench/loadgen/load.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/server_metrics.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "model/tokenizer/tokenizer.h"
#include "server/observability/metrics.h"
#include "tests/test_util.h"

namespace kvserve::bench {
namespace {

using json = nlohmann::json;

TEST_CASE("Percentiles interpolate between the closest ranks", "[bench]") {
  Summary s = Summarize({4, 1, 3, 2});
  REQUIRE(s.count == 4);
  REQUIRE(s.mean == 2.5);
  REQUIRE(s.min == 1);
  REQUIRE(s.max == 4);
  REQUIRE(s.p50 == 2.5);
  REQUIRE(s.p90 == Approx(3.7).epsilon(1e-12));
  REQUIRE(s.p99 == Approx(3.97).epsilon(1e-12));
  SECTION("one value is every percentile; none gives count 0") {
    Summary one = Summarize({7});
    REQUIRE(one.p50 == 7);
    REQUIRE(one.p99 == 7);
    REQUIRE(Summarize({}).count == 0);
  }
}

TEST_CASE("The SSE parser returns data payloads of complete events only", "[bench]") {
  SseParser p;
  REQUIRE(p.Feed("data: {\"a\":1}\n").empty());
  REQUIRE(p.Feed("\ndata: {\"b\"") == std::vector<std::string>{"{\"a\":1}"});
  REQUIRE(p.Feed(":2}\r\n\r\nevent: x\ndata:[DONE]\n\n") ==
          std::vector<std::string>{"{\"b\":2}", "[DONE]"});
  SECTION("comments and events without data give nothing; data lines join with newlines") {
    REQUIRE(p.Feed(": keep-alive\n\nid: 3\n\ndata: a\ndata: b\n\n") ==
            std::vector<std::string>{"a\nb"});
  }
}

TEST_CASE("Chunks give their text, usage and errors", "[bench]") {
  ChunkInfo c = ParseChunk(Api::kCompletions, json::parse(R"({"choices":[{"index":0,"text":" Tim",
      "finish_reason":null}]})"));
  REQUIRE(c.text == " Tim");
  REQUIRE_FALSE(c.has_usage);
  c = ParseChunk(Api::kChat, json::parse(R"({"choices":[{"delta":{"role":"assistant"}}]})"));
  REQUIRE(c.text.empty());
  c = ParseChunk(Api::kChat, json::parse(R"({"choices":[{"delta":{"content":"Hi"}}]})"));
  REQUIRE(c.text == "Hi");
  c = ParseChunk(Api::kChat, json::parse(R"({"choices":[{"message":{"content":"Whole"}}],
      "usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})"));
  REQUIRE(c.text == "Whole");
  REQUIRE(c.has_usage);
  REQUIRE(c.prompt_tokens == 7);
  REQUIRE(c.completion_tokens == 3);
  REQUIRE(c.cached_tokens == -1);
  c = ParseChunk(Api::kCompletions, json::parse(R"({"choices":[],"usage":{"prompt_tokens":40,
      "completion_tokens":16,"prompt_tokens_details":{"cached_tokens":32}}})"));
  REQUIRE(c.text.empty());
  REQUIRE(c.cached_tokens == 32);
  c = ParseChunk(Api::kCompletions, json::parse(R"({"error":{"message":"boom","type":"x"}})"));
  REQUIRE(c.error == "boom");
}

TEST_CASE("Request bodies are plain OpenAI JSON with the extensions asked for", "[bench]") {
  ClientOptions o;
  o.model = "stories";
  BenchRequest r;
  r.prompt = "Once";
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = 5;
  REQUIRE(HttpRequestBody(o, r) ==
          R"({"ignore_eos":true,"max_tokens":5,"model":"stories","prompt":"Once","stream":true,)"
          R"("stream_options":{"include_usage":true},"temperature":0.0})");
  o.send_token_ids = true;
  o.stream = false;
  o.ignore_eos = false;
  o.extra_body = json::parse(R"({"cache_prompt":false,"temperature":0.5})");
  REQUIRE(HttpRequestBody(o, r) ==
          R"({"cache_prompt":false,"max_tokens":5,"model":"stories","prompt":[1,2,3],)"
          R"("stream":false,"temperature":0.5})");
  o = ClientOptions();
  o.api = Api::kChat;
  o.stream = false;
  REQUIRE(HttpRequestBody(o, r) ==
          R"({"ignore_eos":true,"max_tokens":5,"messages":[{"content":"Once","role":"user"}],)"
          R"("stream":false,"temperature":0.0})");
}

TEST_CASE("HTTP URLs split into host, port and path", "[bench]") {
  std::string host, path;
  int port = 0;
  REQUIRE(SplitHttpUrl("http://127.0.0.1:8000", &host, &port, &path));
  REQUIRE((host == "127.0.0.1" && port == 8000 && path.empty()));
  REQUIRE(SplitHttpUrl("http://gpu-box/api/v1/", &host, &port, &path));
  REQUIRE((host == "gpu-box" && port == 80 && path == "/api/v1"));
  REQUIRE(SplitHttpUrl("http://[::1]:9000/metrics", &host, &port, &path));
  REQUIRE((host == "::1" && port == 9000 && path == "/metrics"));
  REQUIRE_FALSE(SplitHttpUrl("https://x:443", &host, &port, &path));
  REQUIRE_FALSE(SplitHttpUrl("http://x:http", &host, &port, &path));
  REQUIRE_FALSE(SplitHttpUrl("http://:80", &host, &port, &path));
}

TEST_CASE("The daemon's own /metrics text gives every server number", "[bench]") {
  ServerMetrics metrics;
  EngineStats s;
  s.num_running = 3;
  s.kv.num_blocks = 100;
  s.kv.num_active_blocks = 40;
  s.kv.active_usage = 0.4;
  s.kv.usage_with_cached = 0.5;
  s.kv.prefix_query_tokens = 800;
  s.kv.prefix_hit_tokens = 600;
  s.preemptions = 7;
  s.kv.swapped_out_blocks = 9;
  s.prompt_tokens = 1234;
  s.generated_tokens = 4321;
  MetricsSnapshot m = ExtractSnapshot(ParsePrometheusText(metrics.Scrape(s)));
  REQUIRE(m.kv_usage == 0.4);
  REQUIRE(m.running == 3);
  REQUIRE(m.kv_blocks == 100);
  REQUIRE(m.prefix_queries == 800);
  REQUIRE(m.prefix_hits == 600);
  REQUIRE(m.preemptions == 7);
  REQUIRE(m.swap_out == 9);
  REQUIRE(m.prompt_tokens == 1234);
  REQUIRE(m.gen_tokens == 4321);
  REQUIRE(m.cpu_seconds.has_value());
  REQUIRE(*m.cpu_seconds > 0);
}

TEST_CASE("vLLM's, llama.cpp's and SGLang's metric names are read too", "[bench]") {
  const char* vllm = R"(# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_running{engine="0",model_name="m"} 12.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:num_preemptions_total{engine="0",model_name="a \"quoted} name"} 4.0
vllm:generation_tokens_total{model_name="m"} 2.5e4 1700000000000
)";
  MetricsSnapshot m = ExtractSnapshot(ParsePrometheusText(vllm));
  REQUIRE(m.kv_usage == 0.5);  // gauges: the largest
  REQUIRE(m.running == 12);
  REQUIRE(m.prefix_queries == 1500);  // counters: the sum
  REQUIRE(m.prefix_hits == 300);
  REQUIRE(m.preemptions == 4);
  REQUIRE(m.gen_tokens == 25000);
  REQUIRE_FALSE(m.kv_blocks.has_value());
  REQUIRE_FALSE(m.swap_out.has_value());
  m = ExtractSnapshot(
      ParsePrometheusText("llamacpp:kv_cache_usage_ratio 0.125\nllamacpp:requests_processing 2\n"));
  REQUIRE(m.kv_usage == 0.125);
  REQUIRE(m.running == 2);
  REQUIRE_FALSE(m.prefix_hits.has_value());
  m = ExtractSnapshot(ParsePrometheusText(
      "sglang:token_usage{model_name=\"m\"} 0.75\nsglang:num_running_reqs{model_name=\"m\"} 9\n"));
  REQUIRE(m.kv_usage == 0.75);
  REQUIRE(m.running == 9);
}

class WorkloadFixture {
 protected:
  WorkloadFixture() {
    auto t = Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
    REQUIRE(t.ok());
    tok_ = *std::move(t);
    auto s = PromptSource::FromFile(testing::SharedDir() + "/data/tinystories_valid_dev.txt",
                                    tok_.get());
    REQUIRE(s.ok());
    source_ = std::make_unique<PromptSource>(*std::move(s));
  }
  // Builds a long_document or multi_turn workload: spec.num_requests
  // requests in rounds over the groups (group i % groups, turn i / groups).
  std::vector<BenchRequest> BuildInRounds(const WorkloadSpec& spec) {
    auto w = BuildWorkload(spec, *source_);
    REQUIRE(w.ok());
    REQUIRE(w->size() == static_cast<size_t>(spec.num_requests));
    for (size_t i = 0; i < w->size(); ++i) {
      REQUIRE((*w)[i].group == static_cast<int>(i) % spec.groups);
      REQUIRE((*w)[i].turn == static_cast<int>(i) / spec.groups);
    }
    return *std::move(w);
  }
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<PromptSource> source_;
};

// A workload of groups (shared prefixes, documents, conversations): 8-token
// suffixes, 4 output tokens.
WorkloadSpec GroupedSpec(WorkloadKind kind, int num_requests, int groups, int prefix_len) {
  WorkloadSpec spec;
  spec.kind = kind;
  spec.num_requests = num_requests;
  spec.groups = groups;
  spec.prefix_len = prefix_len;
  spec.suffix_len = 8;
  spec.output_len = 4;
  return spec;
}

TEST_CASE_METHOD(WorkloadFixture, "Fixed workloads have exactly the asked prompt lengths",
                 "[bench]") {
  WorkloadSpec spec;
  spec.num_requests = 50;
  spec.input_len = 37;
  spec.output_len = 9;
  auto w = BuildWorkload(spec, *source_);
  REQUIRE(w.ok());
  REQUIRE(w->size() == 50);
  std::set<std::string> distinct;
  for (const BenchRequest& r : *w) {
    REQUIRE(r.prompt_ids.size() == 37);
    REQUIRE(r.prompt_ids[0] == tok_->bos_id());
    REQUIRE(r.input_tokens == 37);
    REQUIRE(r.max_tokens == 9);
    // What a server with this tokenizer counts for the text.
    REQUIRE(tok_->Encode(r.prompt, true).size() == 37);
    distinct.insert(r.prompt);
  }
  REQUIRE(distinct.size() == 50);
  SECTION("the same seed builds the same workload; another seed another one") {
    auto again = BuildWorkload(spec, *source_);
    REQUIRE((*again)[17].prompt == (*w)[17].prompt);
    spec.seed = 1;
    auto other = BuildWorkload(spec, *source_);
    REQUIRE((*other)[17].prompt != (*w)[17].prompt);
  }
  SECTION("a request that cannot fit the context is refused") {
    spec.max_model_len = 40;
    REQUIRE(BuildWorkload(spec, *source_).status().message() ==
            "--input-len + --output-len (37 + 9) exceed max_model_len (40)");
  }
}

TEST_CASE_METHOD(WorkloadFixture, "Shared-prefix groups share exactly their prefix", "[bench]") {
  WorkloadSpec spec = GroupedSpec(WorkloadKind::kSharedPrefix, 12, 3, 64);
  auto w = BuildWorkload(spec, *source_);
  REQUIRE(w.ok());
  std::map<int, std::vector<const BenchRequest*>> by_group;
  for (const BenchRequest& r : *w) {
    REQUIRE(r.prompt_ids.size() == 72);
    by_group[r.group].push_back(&r);
  }
  REQUIRE(by_group.size() == 3);
  for (auto& [g, reqs] : by_group) {
    REQUIRE(reqs.size() == 4);
    for (const BenchRequest* r : reqs) {
      REQUIRE(std::equal(r->prompt_ids.begin(), r->prompt_ids.begin() + 64,
                         reqs[0]->prompt_ids.begin()));
      if (r != reqs[0]) REQUIRE(r->prompt_ids != reqs[0]->prompt_ids);
    }
  }
  REQUIRE(!std::equal(by_group[0][0]->prompt_ids.begin(), by_group[0][0]->prompt_ids.begin() + 64,
                      by_group[1][0]->prompt_ids.begin()));
  SECTION("requests of the groups interleave") {
    bool interleaved = false;
    for (size_t i = 1; i < w->size(); ++i) interleaved |= (*w)[i].group != (*w)[i - 1].group;
    REQUIRE(interleaved);
  }
}

TEST_CASE_METHOD(WorkloadFixture, "Long-document questions ask the documents in turn, in order",
                 "[bench]") {
  WorkloadSpec spec = GroupedSpec(WorkloadKind::kLongDocument, 7, 3, 300);
  const std::vector<BenchRequest> w = BuildInRounds(spec);
  for (size_t i = 0; i < w.size(); ++i) {
    const BenchRequest& r = w[i];
    REQUIRE(r.prompt_ids.size() == 308);
    REQUIRE(r.input_tokens == 308);
    const BenchRequest& first = w[i % 3];
    REQUIRE(std::equal(r.prompt_ids.begin(), r.prompt_ids.begin() + 300, first.prompt_ids.begin()));
    if (&r != &first) REQUIRE(r.prompt_ids != first.prompt_ids);
  }
  REQUIRE(
      !std::equal(w[0].prompt_ids.begin(), w[0].prompt_ids.begin() + 300, w[1].prompt_ids.begin()));
  spec.max_model_len = 311;
  REQUIRE(BuildWorkload(spec, *source_).status().message() ==
          "--input-len + --output-len (308 + 4) exceed max_model_len (311)");
}

TEST_CASE_METHOD(WorkloadFixture, "A multi-turn turn extends its conversation's previous prompt",
                 "[bench]") {
  WorkloadSpec spec = GroupedSpec(WorkloadKind::kMultiTurn, 5, 2, 40);
  const std::vector<BenchRequest> w = BuildInRounds(spec);
  const std::vector<size_t> lengths = {40, 40, 48, 48, 56};
  for (size_t i = 0; i < w.size(); ++i) {
    const BenchRequest& r = w[i];
    REQUIRE(r.prompt_ids.size() == lengths[i]);
    REQUIRE(r.input_tokens == static_cast<int>(lengths[i]));
    if (i >= 2) {
      const BenchRequest& previous = w[i - 2];
      REQUIRE(
          std::equal(previous.prompt_ids.begin(), previous.prompt_ids.end(), r.prompt_ids.begin()));
    }
  }
  REQUIRE(w[0].prompt_ids != w[1].prompt_ids);
  // The last round's prompts are the longest: 40 + 2 x 8 tokens.
  spec.max_model_len = 59;
  REQUIRE(BuildWorkload(spec, *source_).status().message() ==
          "--input-len + --output-len (56 + 4) exceed max_model_len (59)");
}

TEST_CASE_METHOD(WorkloadFixture, "ShareGPT-like lengths stay within the context", "[bench]") {
  WorkloadSpec spec;
  spec.kind = WorkloadKind::kShareGpt;
  spec.num_requests = 400;
  spec.input_len = 100;
  spec.output_len = 80;
  spec.max_model_len = 256;
  auto w = BuildWorkload(spec, *source_);
  REQUIRE(w.ok());
  std::vector<double> in, out;
  for (const BenchRequest& r : *w) {
    REQUIRE(r.input_tokens >= spec.min_len);
    REQUIRE(r.max_tokens >= 1);
    REQUIRE(r.input_tokens + r.max_tokens <= 256);
    REQUIRE(static_cast<int>(r.prompt_ids.size()) == r.input_tokens);
    in.push_back(r.input_tokens);
    out.push_back(r.max_tokens);
  }
  // Log-normal around the medians, with a spread.
  Summary si = Summarize(in), so = Summarize(out);
  REQUIRE(si.p50 > 70);
  REQUIRE(si.p50 < 130);
  REQUIRE(so.p50 > 55);
  REQUIRE(so.p50 < 105);
  REQUIRE(si.p90 > 1.5 * si.p50);
}

TEST_CASE_METHOD(WorkloadFixture, "Long-context prompts fill the context", "[bench]") {
  WorkloadSpec spec;
  spec.kind = WorkloadKind::kLongContext;
  spec.num_requests = 3;
  spec.output_len = 12;
  spec.max_model_len = 512;
  auto w = BuildWorkload(spec, *source_);
  REQUIRE(w.ok());
  for (const BenchRequest& r : *w) REQUIRE(r.prompt_ids.size() == 500);
  spec.max_model_len = 0;
  REQUIRE(BuildWorkload(spec, *source_).status().message() ==
          "--max-model-len: long_context needs it (the server did not report one)");
}

TEST_CASE("Without a tokenizer prompt lengths are estimated from characters", "[bench]") {
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "The cat sat on the mat and looked at the dog.\n";
  auto s = PromptSource::FromText(corpus + "<|endoftext|>\n", nullptr, 4.0);
  REQUIRE(s.ok());
  std::mt19937_64 rng(3);
  PromptPiece p = s->Take(50, rng);
  REQUIRE(p.ids.empty());
  REQUIRE(p.text.size() <= 200);
  REQUIRE(p.text.size() > 100);
  REQUIRE(p.text.find("<|endoftext|>") == std::string::npos);
}

TEST_CASE("Poisson arrivals have the asked mean rate", "[bench]") {
  std::vector<double> a = PoissonArrivals(20000, 50, 7);
  REQUIRE(std::is_sorted(a.begin(), a.end()));
  REQUIRE(a.back() / 20000 == Approx(1.0 / 50).epsilon(0.03));
  REQUIRE(PoissonArrivals(20000, 50, 7) == a);
  std::vector<double> burst = PoissonArrivals(3, 0, 7);
  REQUIRE(burst == std::vector<double>{0, 0, 0});
}

// What the fake clients share: requests in flight, their peak, and the
// max_tokens of every request answered. The first `wave` requests are held
// until `wave` of them are in flight at once, so the peak is reached by the
// requests meeting rather than by a sleep; a runner that never lets that
// many run fails the bounded wait instead of hanging.
struct InFlight {
  explicit InFlight(int wave) : wave(wave) {}
  const int wave;
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  int peak ABSL_GUARDED_BY(mu) = 0;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  bool wave_met ABSL_GUARDED_BY(mu) = false;
  std::vector<int> seen ABSL_GUARDED_BY(mu);
};

class FakeClient : public Client {
 public:
  explicit FakeClient(InFlight* f) : f_(f) {}
  RequestResult Send(const BenchRequest& r) override {
    {
      absl::MutexLock lock(&f_->mu);
      f_->peak = std::max(f_->peak, ++f_->in_flight);
      if (++f_->arrived <= f_->wave) {
        // Arrivals, not in_flight: the last of the wave leaves at once.
        auto met = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu) { return f_->arrived >= f_->wave; };
        f_->wave_met = f_->mu.AwaitWithTimeout(absl::Condition(&met), absl::Seconds(30));
      }
      --f_->in_flight;
      f_->seen.push_back(r.max_tokens);
    }
    RequestResult res;
    res.ok = r.max_tokens != 3;  // request 3 "fails"
    if (!res.ok) res.error = "HTTP 500: boom";
    res.ttft_s = 0.001;
    res.e2e_s = 0.001 + 0.0005 * (r.max_tokens - 1);
    res.output_tokens = r.max_tokens;
    res.prompt_tokens = 10;
    return res;
  }

 private:
  InFlight* const f_;
};

TEST_CASE("The load runner keeps the asked concurrency and sends each request once", "[bench]") {
  std::vector<BenchRequest> workload(10);
  for (int i = 0; i < 10; ++i) workload[static_cast<size_t>(i)].max_tokens = i + 1;
  LoadSpec spec;
  SECTION("closed loop") {
    spec.concurrency = 3;
    spec.num_requests = 25;  // wraps around the workload
    InFlight f(3);
    LoadResult r = RunLoad(spec, workload, [&] { return std::make_unique<FakeClient>(&f); }, {});
    REQUIRE(r.results.size() == 25);
    absl::MutexLock lock(&f.mu);
    REQUIRE(f.wave_met);
    REQUIRE(f.peak == 3);
    std::vector<int> seen = f.seen;
    std::sort(seen.begin(), seen.end());
    REQUIRE(std::count(seen.begin(), seen.end(), 1) == 3);
    REQUIRE(std::count(seen.begin(), seen.end(), 10) == 2);
    RunReport rep = Aggregate(spec, r, {});
    REQUIRE(rep.completed == 22);
    REQUIRE(rep.failed == 3);
    REQUIRE(rep.errors == std::vector<std::string>{"HTTP 500: boom"});
    REQUIRE(rep.input_tokens == 220);
    REQUIRE(rep.output_tokens == 125 - 9);  // 1..10, 1..10, 1..5 less the three 3s
    REQUIRE(rep.tpot_ms.p50 == Approx(0.5));
    REQUIRE(rep.ttft_ms.max == Approx(1.0));
    REQUIRE(rep.requests_per_s == Approx(22 / r.duration_s));
  }
  SECTION("open loop, all at once, capped in flight") {
    spec.mode = LoadSpec::Mode::kOpen;
    spec.request_rate = 0;
    spec.max_concurrency = 4;
    InFlight f(4);
    LoadResult r = RunLoad(spec, workload, [&] { return std::make_unique<FakeClient>(&f); }, {});
    REQUIRE(r.results.size() == 10);
    absl::MutexLock lock(&f.mu);
    REQUIRE(f.wave_met);
    REQUIRE(f.peak == 4);
  }
  SECTION("open loop at a rate, stopped by time") {
    spec.mode = LoadSpec::Mode::kOpen;
    spec.request_rate = 200;
    spec.duration_s = 0.3;
    InFlight f(0);
    LoadResult r = RunLoad(spec, workload, [&] { return std::make_unique<FakeClient>(&f); }, {});
    REQUIRE(r.results.size() > 10);
    REQUIRE(r.results.size() < 150);
  }
}

}  // namespace
}  // namespace kvserve::bench
