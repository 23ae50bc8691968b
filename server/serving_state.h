// ServingState: what the HTTP and gRPC front ends share inside one daemon —
// the engine (absent while the model loads), the lifecycle phase, the
// metrics, the served model's description, the in-flight call count that
// a graceful shutdown waits on, and the engine gate (server/admission/engine_gate.h)
// every use of the engine by either front end holds a lease on.
//
// Lifecycle: kLoading -> kReady -> kDraining. Readiness (/health, the gRPC
// health service) is kReady only; generation calls in any other phase are
// refused with 503 / UNAVAILABLE. The engine pointer is set once, before
// kReady, and stays valid until the front ends are stopped.
//
// Thread-safety: every method is safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/chat/chat_template.h"
#include "model/runner_memory_info.h"
#include "scheduler/engine.h"
#include "server/admission/auth.h"
#include "server/admission/engine_gate.h"
#include "server/observability/metrics.h"

namespace kvserve {

// The served model as the APIs describe it (/v1/models, GetModelInfo).
struct ServedModelInfo {
  std::string name;
  std::string device = "cpu";
  std::string kv_dtype;
  int32_t block_size = 0;
  int32_t num_blocks = 0;
  int32_t num_swap_blocks = 0;
  int32_t max_model_len = 0;
  bool prefix_caching = true;
  RunnerMemoryInfo memory;  // weights, activations and the KV pool as allocated
  // FingerprintBytes of the weight files as loaded ("" for a dummy model).
  std::string weights_fingerprint;
};

// A fresh random request id (16 hex digits).
std::string NewRequestId();
// A client-chosen id is kept when it is 1-128 characters of [A-Za-z0-9._:-].
bool IsAcceptableRequestId(std::string_view id);

class ServingState {
 public:
  enum class Phase { kLoading, kReady, kDraining };

  // `api_keys` null or empty: no authentication.
  ServingState(ServerMetrics* metrics, ChatTemplate chat_template,
               std::shared_ptr<const ApiKeys> api_keys);
  // One key ("" = none).
  ServingState(ServerMetrics* metrics, ChatTemplate chat_template, const std::string& api_key);

  // Publishes the engine and becomes ready.
  void SetReady(Engine* engine, ServedModelInfo info);
  // Stops admitting new calls (in-flight ones continue).
  void StartDraining();

  Phase phase() const { return phase_.load(std::memory_order_acquire); }
  // False while the gRPC port cannot accept (GrpcService's watchdog saw it
  // stop): /health is then 503 although generation over HTTP works.
  void SetGrpcAccepting(bool accepting) { grpc_accepting_.store(accepting); }
  bool grpc_accepting() const { return grpc_accepting_.load(); }
  bool ready() const { return phase() == Phase::kReady; }
  // Null while loading.
  Engine* engine() const { return engine_.load(std::memory_order_acquire); }
  const ServedModelInfo& info() const { return info_; }  // valid once ready
  ServerMetrics& metrics() const { return *metrics_; }
  const ChatTemplate& chat_template() const { return chat_template_; }
  // The keys both front ends check (never null; empty = no authentication).
  const std::shared_ptr<const ApiKeys>& api_keys() const { return api_keys_; }
  // True when `authorization` ("Bearer <key>", scheme in any case) names one
  // of the keys, or no key is set (constant-time compare: server/admission/auth.h).
  bool Authorized(std::string_view authorization) const {
    return api_keys_->Authorize(authorization);
  }

  // Generation calls still running (streams included).
  void CallStarted();
  void CallFinished();
  int64_t calls_in_flight() const;
  // Waits until no call is in flight or `deadline`; true when idle.
  bool WaitForCalls(absl::Time deadline) const;

  // The front ends' drain gate: a handler or call uses engine() only while
  // it holds a lease; the daemon closes the gate before destroying the engine.
  EngineGate& gate() const { return gate_; }

 private:
  ServerMetrics* const metrics_;
  const ChatTemplate chat_template_;
  const std::shared_ptr<const ApiKeys> api_keys_;
  std::atomic<Phase> phase_{Phase::kLoading};
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<bool> grpc_accepting_{true};
  ServedModelInfo info_;  // written once before phase_ becomes kReady

  mutable absl::Mutex mu_;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  mutable EngineGate gate_;
};

}  // namespace kvserve
