// server/observability/: what the daemon tells its operators: the
// Prometheus metrics behind GET /metrics (metrics.h, this header), the KV
// tiers' series (tier_metrics.h), and the logging set-up, its formats and
// request-scoped lines (logging.h).
//
// ServerMetrics: the Prometheus metrics behind GET /metrics, in the text
// exposition format (prometheus-cpp's registry and TextSerializer; no
// separate exporter thread or port).
//
// Gauges and counters mirror Engine::GetStats(): they are refreshed when
// scraped, counters by the growth since the previous scrape, so the engine
// keeps one source of truth. process_cpu_seconds_total (the standard
// Prometheus name) is the daemon's user + system CPU time, so a benchmark
// can divide work by CPU spent on a machine it shares. Latency histograms are observed per finished
// request from EngineConfig::on_request_finished (engine thread).
//
// Thread-safety: every method is safe from any thread; ObserveRequest only
// takes prometheus-cpp's short per-metric locks, so it never blocks the
// engine for long.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "model/runner_memory_info.h"
#include "scheduler/engine_stats.h"
#include "scheduler/request.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kvserve {

class TierMetrics;  // server/observability/tier_metrics.h

class ServerMetrics {
 public:
  ServerMetrics();
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // One finished request's timings and token counts.
  void ObserveRequest(const RequestMetrics& m);
  // One HTTP response, by status code ("200", "400", ...).
  void CountHttpResponse(int status);
  // HTTP connections open now, TLS included (HttpServer::connections(), set
  // by the /metrics handler just before it scrapes).
  void SetHttpOpenConnections(int open);
  // Whether the daemon accepts work (1) or is loading/draining (0).
  void SetReady(bool ready);
  // What the model runner allocated (set once the model is loaded): bytes of
  // weights, activations and one KV block, the pool's blocks, bytes and
  // tokens.
  void SetMemory(const RunnerMemoryInfo& memory);
  // kvserve_model_weights_info{fingerprint="<16 hex digits>"} 1 (once, at load).
  void SetWeightsFingerprint(const std::string& fingerprint);

  // Refreshes gauges and counters from `stats`, then renders the registry.
  std::string Scrape(const EngineStats& stats);
  // Renders without engine numbers (while the model loads).
  std::string Scrape();

 private:
  struct Handles;
  void UpdateLocked(const EngineStats& stats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Serialize() const;

  // process_cpu_seconds_total from getrusage, advanced at each scrape.
  void UpdateCpuLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Handles> h_;
  std::unique_ptr<TierMetrics> tiers_ ABSL_GUARDED_BY(mu_);  // once the engine has tiers
  absl::Mutex mu_;
  EngineStats last_ ABSL_GUARDED_BY(mu_);
  double last_cpu_s_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvserve
