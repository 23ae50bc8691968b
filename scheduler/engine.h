// Engine: one thread that owns the scheduler, the KV cache manager and the
// model runner. Front ends only Submit() requests and read their
// RequestStreams; nothing else crosses threads.
//
// Each step the scheduler admits waiting requests while blocks and the token
// budget allow (continuous batching), runs every running sequence's decode
// token plus prefill chunks in one BatchInput, samples, and pushes outputs to
// the streams. When the pool runs dry it preempts (recompute or swap).
//
// Thread-safety: Submit, GetStats, Drain and the accessors are safe from any
// thread.
//
// Example:
//   auto engine = Engine::Create(config, std::move(runner), tokenizer);
//   GenerateRequest req; req.prompt = "Once upon a time"; req.max_tokens = 64;
//   auto stream = (*engine)->Submit(std::move(req));
//   GenerateOutput out;
//   while ((*stream)->Next(&out) == RequestStream::Pop::kOutput) std::cout << out.text;
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/model_config.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/engine_config.h"
#include "scheduler/engine_stats.h"
#include "scheduler/request.h"
#include "scheduler/request_stream.h"

namespace kvserve {

class ModelRunner;  // model/model_runner.h

class Engine {
 public:
  // Fails (with numbers) when not even one sequence of max_model_len fits.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        std::unique_ptr<ModelRunner> runner,
                                                        std::shared_ptr<const Tokenizer> tokenizer);
  // Cancels whatever is still running and joins the engine thread.
  virtual ~Engine() = default;

  // InvalidArgument naming the field for bad parameters (temperature < 0,
  // top_p outside (0, 1], max_tokens < 1, prompt + max_tokens beyond
  // max_model_len or beyond the whole pool, ...); ResourceExhausted when the
  // queue is full; Unavailable while draining.
  virtual absl::StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest request) = 0;

  // A consistent snapshot of the counters and gauges.
  virtual EngineStats GetStats() const = 0;

  // Stops admitting new requests (Submit returns Unavailable), lets in-flight
  // ones finish until `deadline`, then cancels the rest. Returns when idle.
  // `deadline` is read on EngineConfig::clock (the real clock by default).
  virtual void Drain(absl::Time deadline) = 0;
  virtual bool draining() const = 0;

  virtual const ModelConfig& model_config() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  virtual const EngineConfig& config() const = 0;
};

}  // namespace kvserve
