// The connection probe: does a client that keeps its connection open wait
// longer than one that opens a fresh connection per request? It sends the
// same 1-token completion N times over one kept-alive connection and N times
// over fresh connections, interleaved (fresh, kept, kept, fresh, ...) so a
// noisy machine slows both alike, and compares the medians. A daemon that
// writes a response in two pieces without TCP_NODELAY shows up here as a
// ~40 ms kept-alive median (Nagle's algorithm waiting for the client's
// delayed ACK) against ~1 ms fresh.
//
// Cases: "http" (plain JSON), "http_stream" (SSE) on the configured HTTP API,
// and "grpc" (a reused channel against a new channel per request) when a
// gRPC target is given.
//
// Thread-safety: RunConnectionProbe blocks its caller.
#pragma once

#include <string>
#include <vector>

#include "bench/loadgen/client.h"
#include "bench/loadgen/stats.h"

namespace kvserve::bench {

struct ProbeCase {
  std::string name;  // "http", "http_stream", "grpc"
  Summary fresh_ms;
  Summary kept_alive_ms;
  double ratio_p50 = 0;  // kept_alive p50 / fresh p50
  int64_t failed = 0;
  std::string first_error;
};

// `requests` of each kind per case, after a few unmeasured warm-up requests.
// options.api picks the HTTP API (completions or chat); its stream flag is
// overridden per case.
std::vector<ProbeCase> RunConnectionProbe(const ClientOptions& options, int requests,
                                          bool include_http, bool progress);

}  // namespace kvserve::bench
