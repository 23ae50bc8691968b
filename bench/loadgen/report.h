// A benchmark's results: per-run aggregates (throughput, latency
// percentiles, server-side KV numbers), the connection probe, and their two
// renderings: JSON in the fixed schema of bench/kvserve_bench_schema.json
// (every key always present, null where a value is unknown, so runs of
// different servers and versions compare key by key) and a table for people.
//
// TPOT is per request: (E2E - TTFT) / (output tokens - 1), for requests with
// at least 2 output tokens; its percentiles are over requests. ITL pools the
// gaps between output chunks of all requests. Token rates divide by the run's
// duration (first send to last response). Input tokens are the server's
// usage.prompt_tokens when reported, else the workload's count.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/loadgen/client.h"
#include "bench/loadgen/load.h"
#include "bench/loadgen/probe.h"
#include "bench/loadgen/server_metrics.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"

namespace kvserve::bench {

inline constexpr char kSchemaId[] = "kvserve-bench/1";

struct RunReport {
  LoadSpec load;
  double duration_s = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  std::vector<std::string> errors;  // up to 5 distinct messages
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  std::optional<int64_t> cached_tokens;  // summed usage cached_tokens, when reported
  double requests_per_s = 0;
  double input_tokens_per_s = 0;
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;
  double mean_output_tokens = 0;
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  ServerRunStats server;
};

RunReport Aggregate(const LoadSpec& load, const LoadResult& result, const ServerRunStats& server);

struct BenchReport {
  std::string label;
  std::string started_at;  // ISO 8601, UTC
  ClientOptions client;
  int max_model_len = 0;  // 0: unknown
  WorkloadSpec workload;
  std::string dataset;
  std::string tokenizer;       // "" = none
  double chars_per_token = 0;  // the length estimate without a tokenizer; 0 with one
  std::vector<RunReport> runs;
  bool probe_ran = false;
  int probe_requests = 0;
  std::vector<ProbeCase> probe;
};

// Keys in the schema's order.
nlohmann::ordered_json ToJson(const BenchReport& report);

// One record per request of run `run` (0-based), in the workload's order:
// run, index (the request number), group and turn (null where the workload
// has none), ok, error, ttft_ms, e2e_ms, prompt_tokens, cached_tokens,
// output_tokens and the output text (what --requests-json writes, one array
// for all runs: greedy outputs compare request by request).
nlohmann::ordered_json RequestRecords(int run, const LoadResult& result,
                                      const std::vector<BenchRequest>& workload);
std::string FormatTable(const BenchReport& report);

// Now as "2025-01-31T12:34:56Z".
std::string UtcNowIso8601();

}  // namespace kvserve::bench
