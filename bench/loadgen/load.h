// The load runner: sends a workload's requests to a server with a fixed
// number of clients (closed loop) or at Poisson-distributed arrival times
// (open loop), and collects every request's timings.
//
//   closed loop   `concurrency` clients, each with its own kept-alive
//                 connection, send back to back: a new request goes out as
//                 soon as the client's previous one ends.
//   open loop     requests arrive at `request_rate` per second with
//                 exponential gaps (a Poisson process; rate 0 means all at
//                 once), whether or not earlier ones have finished; at most
//                 `max_concurrency` are in flight (one kept-alive connection
//                 each), later arrivals wait for a free connection and are
//                 timed from when they are sent, as vLLM's
//                 benchmark_serving --max-concurrency does.
// Requests are taken from the workload in order and wrap around when
// `num_requests` exceeds it; `duration_s` > 0 stops sending after that many
// seconds (requests in flight finish).
//
// A progress bar goes to stderr while it runs (when enabled).
//
// Thread-safety: RunLoad blocks its caller and runs its own threads; the
// client factory is called from those threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/loadgen/client.h"
#include "bench/loadgen/workload.h"

namespace kvserve::bench {

struct LoadSpec {
  enum class Mode { kClosed, kOpen };
  Mode mode = Mode::kClosed;
  int concurrency = 1;       // closed loop
  double request_rate = 0;   // open loop, requests/s; 0: all at once
  int max_concurrency = 64;  // open loop
  int num_requests = 0;      // 0: the workload's size (or unlimited with duration_s)
  double duration_s = 0;     // 0: until num_requests are done
  uint64_t seed = 0;         // arrival times
};

struct LoadResult {
  double duration_s = 0;  // first send to last response
  std::vector<RequestResult> results;
};

using ClientFactory = std::function<std::unique_ptr<Client>()>;

struct ProgressOptions {
  bool enabled = false;
  std::string label;  // shown before the bar
};

LoadResult RunLoad(const LoadSpec& spec, const std::vector<BenchRequest>& workload,
                   const ClientFactory& make_client, const ProgressOptions& progress);

// Draws the arrival offsets (seconds from the start) of `n` requests of an
// open loop at `rate` per second; all zero when rate is 0.
std::vector<double> PoissonArrivals(int n, double rate, uint64_t seed);

}  // namespace kvserve::bench
