// The server-side numbers of a benchmark run, read from the Prometheus text
// that GET /metrics serves: KV cache usage, sequences running, prefix-cache
// lookups and hits, preemptions, swaps and token counters.
//
// Metric names differ between servers; the first name of each list that a
// server exposes is used (counters are summed and gauges maxed over label
// sets, so per-model or per-engine labels do not matter):
//   kv_usage       kvserve_kv_usage_ratio{kind="active"}, vllm:kv_cache_usage_perc,
//                  vllm:gpu_cache_usage_perc, llamacpp:kv_cache_usage_ratio,
//                  sglang:token_usage (all 0..1)
//   running        kvserve_running_sequences, vllm:num_requests_running,
//                  llamacpp:requests_processing, sglang:num_running_reqs
//   prefix_queries kvserve_prefix_cache_queries_tokens_total, vllm:prefix_cache_queries_total,
//                  vllm:gpu_prefix_cache_queries_total (tokens)
//   prefix_hits    kvserve_prefix_cache_hits_tokens_total, vllm:prefix_cache_hits_total,
//                  vllm:gpu_prefix_cache_hits_total (tokens)
//   preemptions    kvserve_preemptions_total, vllm:num_preemptions_total
//   swap_out       kvserve_swap_out_blocks_total
//   kv_blocks      kvserve_kv_blocks_capacity
//   prompt_tokens  kvserve_prompt_tokens_total, vllm:prompt_tokens_total,
//                  llamacpp:prompt_tokens_total, sglang:prompt_tokens_total
//   gen_tokens     kvserve_generation_tokens_total, vllm:generation_tokens_total,
//                  llamacpp:tokens_predicted_total, sglang:generation_tokens_total
//   cpu_seconds    process_cpu_seconds_total (the serving process's CPU time;
//                  on vLLM only its API server process, not the engine core)
// A value a server does not expose stays unset (null in the JSON).
//
// Thread-safety: ParsePrometheusText and the snapshot types are plain
// values; MetricsWatcher's Sample/Stop may be called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvserve::bench {

struct PromSample {
  std::string name;
  std::string labels;  // the text between the braces, "" when none
  double value = 0;
};

// Sample lines of a text exposition; comments, blank and malformed lines
// are skipped.
std::vector<PromSample> ParsePrometheusText(std::string_view text);

struct MetricsSnapshot {
  std::optional<double> kv_usage;
  std::optional<double> running;
  std::optional<double> prefix_queries;
  std::optional<double> prefix_hits;
  std::optional<double> preemptions;
  std::optional<double> swap_out;
  std::optional<double> kv_blocks;
  std::optional<double> prompt_tokens;
  std::optional<double> gen_tokens;
  std::optional<double> cpu_seconds;
};

MetricsSnapshot ExtractSnapshot(const std::vector<PromSample>& samples);

// What the server did during a run: gauges before, after and at their peak
// (sampled while the run went on), counters as their growth.
struct ServerRunStats {
  bool scraped = false;  // /metrics answered before and after
  std::optional<double> kv_usage_before, kv_usage_after, kv_usage_peak;
  std::optional<double> running_peak;
  std::optional<double> kv_blocks;
  std::optional<double> prefix_query_tokens, prefix_hit_tokens, prefix_hit_rate;
  std::optional<double> preemptions, swap_out_blocks;
  std::optional<double> prompt_tokens, generation_tokens;
  std::optional<double> cpu_seconds;
};

// Scrapes a /metrics URL before a run, every `interval` during it (on its
// own thread and connection) and after it.
class MetricsWatcher {
 public:
  // url: "http://host:port/metrics"; "" disables (Finish returns scraped = false).
  MetricsWatcher(std::string url, double interval_s = 0.1);
  ~MetricsWatcher();

  void Start();             // scrape "before", then sample in the background
  ServerRunStats Finish();  // stop sampling, scrape "after"

  // One scrape; nullopt when the server did not answer 200.
  static std::optional<MetricsSnapshot> Scrape(const std::string& url);

 private:
  void Loop();

  std::string url_;
  double interval_s_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::optional<MetricsSnapshot> before_;
  std::optional<double> kv_peak_ ABSL_GUARDED_BY(mu_);
  std::optional<double> running_peak_ ABSL_GUARDED_BY(mu_);
};

// Splits "http://host:port/path" into its parts; false when it is not an
// http URL (https is not supported: the client is built without TLS).
bool SplitHttpUrl(std::string_view url, std::string* host, int* port, std::string* path);

}  // namespace kvserve::bench
