// BuildEngine: from a ServeConfig to a running Engine — load the model and
// tokenizer, create the model runner for model.device (CreateModelRunner,
// which sizes the KV pool: model/runner_factory.h, cache/sizing/kv_pool_plan.h) and
// start the engine thread. A dummy model on CUDA is not materialized on the
// host; the runner generates its weights on the device.
//
// Thread-safety: a pure function; may take seconds (weights are read).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "scheduler/engine.h"
#include "server/config/config.h"
#include "server/serving_state.h"

namespace kvserve {

struct BuiltEngine {
  std::unique_ptr<Engine> engine;
  ServedModelInfo info;
};

// What `kvserve serve --check` checks: everything start-up would refuse short
// of loading the weights (the runner options, the device named by
// model.device, that model.path and model.tokenizer exist). Errors name the key.
absl::Status CheckBeforeLoad(const ServeConfig& config);

// on_request_finished goes into the EngineConfig (engine thread; must not block).
absl::StatusOr<BuiltEngine> BuildEngine(
    const ServeConfig& config, std::function<void(const RequestMetrics&)> on_request_finished);

}  // namespace kvserve
