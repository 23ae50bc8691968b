#include "server/observability/metrics.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cache/eviction/eviction_policy.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

// The value of the sample line that starts with `series` (name{labels}).
double Sample(const std::string& text, const std::string& series) {
  size_t pos = text.find("\n" + series + " ");
  REQUIRE(pos != std::string::npos);
  pos += series.size() + 2;
  return std::stod(text.substr(pos, text.find('\n', pos) - pos));
}

EngineStats SomeStats() {
  EngineStats s;
  s.num_waiting = 3;
  s.num_tier_loading = 2;  // of the 3 waiting
  s.num_running = 5;
  s.kv.num_blocks = 100;
  s.kv.num_free_blocks = 60;
  s.kv.num_active_blocks = 40;
  s.kv.num_cached_blocks = 10;
  s.kv.active_usage = 0.4;
  s.kv.usage_with_cached = 0.5;
  s.prompt_tokens = 120;
  s.generated_tokens = 300;
  s.preemptions = 2;
  s.kv.prefix_query_tokens = 100;
  s.kv.prefix_hit_tokens = 48;
  s.kv.swapped_out_blocks = 7;
  s.kv.swapped_in_blocks = 6;
  s.requests_finished_stop = 4;
  s.requests_finished_length = 1;
  s.requests_finished_cancelled = 2;
  s.kv_evictions[3] = 11;  // h2o
  s.kv_evicted_tokens[3] = 12;
  s.kv_eviction_freed_blocks[2] = 13;  // streaming
  return s;
}

TEST_CASE("The runner's memory is exported once the model is loaded", "[server]") {
  ServerMetrics m;
  RunnerMemoryInfo info;
  info.weight_bytes = 16060522496;
  info.activation_bytes = 2 << 20;
  info.kv_bytes_per_block = 1081344;
  info.num_blocks = 1000;
  info.kv_pool_bytes = 1081344000;
  info.kv_pool_tokens = 16000;
  info.num_swap_blocks = 64;
  m.SetMemory(info);
  const std::string text = m.Scrape();
  REQUIRE(Sample(text, "kvserve_model_weight_bytes") == 16060522496.0);
  REQUIRE(Sample(text, "kvserve_activation_bytes") == 2 << 20);
  REQUIRE(Sample(text, "kvserve_kv_block_bytes") == 1081344);
  REQUIRE(Sample(text, "kvserve_kv_pool_bytes") == 1081344000.0);
  REQUIRE(Sample(text, "kvserve_kv_pool_tokens") == 16000);
  REQUIRE(Sample(text, "kvserve_kv_swap_blocks_capacity") == 64);
}

TEST_CASE("Gauges mirror the engine and counters advance by its deltas", "[server]") {
  ServerMetrics m;
  EngineStats s = SomeStats();
  std::string text = m.Scrape(s);
  REQUIRE(Sample(text, "kvserve_queue_length") == 3);
  REQUIRE(Sample(text, "kvserve_kv_tier_loading_requests") == 2);
  REQUIRE(Sample(text, "kvserve_running_sequences") == 5);
  REQUIRE(Sample(text, "kvserve_kv_usage_ratio{kind=\"active\"}") == 0.4);
  REQUIRE(Sample(text, "kvserve_kv_usage_ratio{kind=\"with_cached\"}") == 0.5);
  REQUIRE(Sample(text, "kvserve_kv_blocks{state=\"active\"}") == 40);
  REQUIRE(Sample(text, "kvserve_kv_blocks{state=\"cached\"}") == 10);
  REQUIRE(Sample(text, "kvserve_kv_blocks{state=\"free\"}") == 50);
  REQUIRE(Sample(text, "kvserve_kv_blocks_capacity") == 100);
  REQUIRE(Sample(text, "kvserve_requests_total{finish_reason=\"stop\"}") == 4);
  REQUIRE(Sample(text, "kvserve_requests_total{finish_reason=\"cancelled\"}") == 2);
  REQUIRE(Sample(text, "kvserve_prefix_cache_hits_tokens_total") == 48);
  REQUIRE(Sample(text, "kvserve_swap_out_blocks_total") == 7);
  REQUIRE(Sample(text, "kvserve_generation_tokens_total") == 300);
  REQUIRE(Sample(text, "kvserve_kv_evictions_total{policy=\"h2o\"}") == 11);
  REQUIRE(Sample(text, "kvserve_kv_evicted_tokens_total{policy=\"h2o\"}") == 12);
  REQUIRE(Sample(text, "kvserve_kv_eviction_freed_blocks_total{policy=\"streaming\"}") == 13);
  REQUIRE(Sample(text, "kvserve_kv_evictions_total{policy=\"none\"}") == 0);

  SECTION("a second scrape adds only what grew") {
    s.generated_tokens = 350;
    s.requests_finished_stop = 6;
    s.num_running = 0;
    s.num_tier_loading = 0;
    s.kv.active_usage = 0;
    text = m.Scrape(s);
    REQUIRE(Sample(text, "kvserve_generation_tokens_total") == 350);
    REQUIRE(Sample(text, "kvserve_requests_total{finish_reason=\"stop\"}") == 6);
    REQUIRE(Sample(text, "kvserve_running_sequences") == 0);
    REQUIRE(Sample(text, "kvserve_kv_tier_loading_requests") == 0);
    REQUIRE(Sample(text, "kvserve_kv_usage_ratio{kind=\"active\"}") == 0);
  }
}

// Every counter fed from EngineStats, with the field it counts. Each gets a
// distinct value, so a counter fed from the wrong field (or from none) fails.
struct CounterField {
  std::string series;
  std::function<int64_t&(EngineStats&)> field;
};

std::vector<CounterField> EngineCounters() {
  std::vector<CounterField> c = {
      {"kvserve_requests_total{finish_reason=\"stop\"}",
       [](EngineStats& s) -> int64_t& { return s.requests_finished_stop; }},
      {"kvserve_requests_total{finish_reason=\"length\"}",
       [](EngineStats& s) -> int64_t& { return s.requests_finished_length; }},
      {"kvserve_requests_total{finish_reason=\"cancelled\"}",
       [](EngineStats& s) -> int64_t& { return s.requests_finished_cancelled; }},
      {"kvserve_requests_total{finish_reason=\"error\"}",
       [](EngineStats& s) -> int64_t& { return s.requests_finished_error; }},
      {"kvserve_requests_rejected_total",
       [](EngineStats& s) -> int64_t& { return s.requests_rejected; }},
      {"kvserve_prefix_cache_queries_tokens_total",
       [](EngineStats& s) -> int64_t& { return s.kv.prefix_query_tokens; }},
      {"kvserve_prefix_cache_hits_tokens_total",
       [](EngineStats& s) -> int64_t& { return s.kv.prefix_hit_tokens; }},
      {"kvserve_preemptions_total", [](EngineStats& s) -> int64_t& { return s.preemptions; }},
      {"kvserve_swap_out_blocks_total",
       [](EngineStats& s) -> int64_t& { return s.kv.swapped_out_blocks; }},
      {"kvserve_swap_in_blocks_total",
       [](EngineStats& s) -> int64_t& { return s.kv.swapped_in_blocks; }},
      {"kvserve_copy_on_write_blocks_total",
       [](EngineStats& s) -> int64_t& { return s.kv.cow_copies; }},
      {"kvserve_cached_block_evictions_total",
       [](EngineStats& s) -> int64_t& { return s.kv.evicted_cached_blocks; }},
      {"kvserve_engine_steps_total", [](EngineStats& s) -> int64_t& { return s.steps; }},
      {"kvserve_batched_tokens_total", [](EngineStats& s) -> int64_t& { return s.batched_tokens; }},
      {"kvserve_batched_sequences_total",
       [](EngineStats& s) -> int64_t& { return s.batched_seqs; }},
      {"kvserve_prompt_tokens_total", [](EngineStats& s) -> int64_t& { return s.prompt_tokens; }},
      {"kvserve_generation_tokens_total",
       [](EngineStats& s) -> int64_t& { return s.generated_tokens; }},
  };
  for (EvictionPolicyKind kind : kAllEvictionPolicies) {
    const int i = static_cast<int>(kind);
    const std::string policy(EvictionPolicyName(kind));
    c.push_back({"kvserve_kv_evictions_total{policy=\"" + policy + "\"}",
                 [i](EngineStats& s) -> int64_t& { return s.kv_evictions[i]; }});
    c.push_back({"kvserve_kv_evicted_tokens_total{policy=\"" + policy + "\"}",
                 [i](EngineStats& s) -> int64_t& { return s.kv_evicted_tokens[i]; }});
    c.push_back({"kvserve_kv_eviction_freed_blocks_total{policy=\"" + policy + "\"}",
                 [i](EngineStats& s) -> int64_t& { return s.kv_eviction_freed_blocks[i]; }});
  }
  return c;
}

TEST_CASE("Every engine counter advances by exactly what its own field grew", "[server]") {
  const std::vector<CounterField> counters = EngineCounters();
  ServerMetrics m;
  EngineStats s;
  // Field k holds 1000 + 7k, then grows by k + 1: every value is distinct.
  for (size_t k = 0; k < counters.size(); ++k) counters[k].field(s) = 1000 + 7 * k;
  std::string text = m.Scrape(s);
  for (size_t k = 0; k < counters.size(); ++k) {
    INFO(counters[k].series);
    REQUIRE(Sample(text, counters[k].series) == 1000 + 7 * k);
  }
  for (size_t k = 0; k < counters.size(); ++k) counters[k].field(s) += k + 1;
  text = m.Scrape(s);
  for (size_t k = 0; k < counters.size(); ++k) {
    INFO(counters[k].series);
    REQUIRE(Sample(text, counters[k].series) == 1000 + 8 * k + 1);
  }
  // A field that went back (an engine restarted) adds nothing.
  for (size_t k = 0; k < counters.size(); ++k) counters[k].field(s) = 0;
  text = m.Scrape(s);
  for (size_t k = 0; k < counters.size(); ++k) {
    INFO(counters[k].series);
    REQUIRE(Sample(text, counters[k].series) == 1000 + 8 * k + 1);
  }
  // The table is every kvserve_* counter family but the front ends' own.
  std::set<std::string> families;
  for (size_t pos = text.find("# TYPE kvserve_"); pos != std::string::npos;
       pos = text.find("# TYPE kvserve_", pos + 1)) {
    const std::string line = text.substr(pos + 7, text.find('\n', pos) - pos - 7);
    if (line.ends_with(" counter")) families.insert(line.substr(0, line.find(' ')));
  }
  std::set<std::string> tabled;
  for (const CounterField& c : counters) tabled.insert(c.series.substr(0, c.series.find('{')));
  for (const char* own : {"kvserve_http_responses_total", "kvserve_grpc_calls_total"}) {
    families.erase(own);
  }
  REQUIRE(tabled == families);
}

TEST_CASE("Finished requests feed the latency histograms", "[server]") {
  ServerMetrics m;
  RequestMetrics r;
  r.queue_s = 0.002;
  r.ttft_s = 0.03;
  r.tpot_s = 0.004;
  r.e2e_s = 1.2;
  r.usage = Usage{10, 0, 100};
  m.ObserveRequest(r);
  r.ttft_s = 0;  // no token: no TTFT sample
  r.tpot_s = 0;
  m.ObserveRequest(r);
  std::string text = m.Scrape();
  REQUIRE(Sample(text, "kvserve_time_to_first_token_seconds_count") == 1);
  REQUIRE(Sample(text, "kvserve_time_to_first_token_seconds_bucket{le=\"0.05\"}") == 1);
  REQUIRE(Sample(text, "kvserve_time_to_first_token_seconds_bucket{le=\"0.025\"}") == 0);
  REQUIRE(Sample(text, "kvserve_time_per_output_token_seconds_count") == 1);
  REQUIRE(Sample(text, "kvserve_e2e_request_latency_seconds_count") == 2);
  REQUIRE(Sample(text, "kvserve_e2e_request_latency_seconds_sum") == Approx(2.4));
  REQUIRE(Sample(text, "kvserve_queue_time_seconds_count") == 2);
  REQUIRE(Sample(text, "kvserve_request_generation_tokens_sum") == 200);
  m.CountHttpResponse(200);
  m.CountHttpResponse(200);
  m.CountHttpResponse(429);
  m.SetReady(true);
  m.SetHttpOpenConnections(7);
  text = m.Scrape();
  REQUIRE(Sample(text, "kvserve_http_responses_total{code=\"200\"}") == 2);
  REQUIRE(Sample(text, "kvserve_http_responses_total{code=\"429\"}") == 1);
  REQUIRE(Sample(text, "kvserve_ready") == 1);
  REQUIRE(text.find("# HELP kvserve_http_open_connections HTTP connections currently open, TLS "
                    "included (not those refused over the cap).\n"
                    "# TYPE kvserve_http_open_connections gauge\n"
                    "kvserve_http_open_connections 7\n") != std::string::npos);
  m.SetHttpOpenConnections(2);
  REQUIRE(Sample(m.Scrape(), "kvserve_http_open_connections") == 2);
}

TEST_CASE("promtool check metrics accepts the exposition", "[server]") {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    WARN("promtool not installed (Debian package prometheus): skipping the lint");
    return;
  }
  ServerMetrics m;
  RequestMetrics r;
  r.ttft_s = 0.01;
  r.tpot_s = 0.01;
  r.e2e_s = 0.5;
  m.ObserveRequest(r);
  m.CountHttpResponse(200);
  m.SetHttpOpenConnections(3);
  std::string path = testing::MakeTempDir("metrics") + "/metrics.txt";
  {
    std::ofstream out(path);
    out << m.Scrape(SomeStats());
  }
  std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) output.append(buf, n);
  int rc = pclose(p);
  INFO(output);
  REQUIRE(rc == 0);
  REQUIRE(output.empty());
}

}  // namespace
}  // namespace kvserve
