// BuildEngine: from a ServeConfig to a running Engine — load the model and
// tokenizer, size the KV pool, create the model runner for the configured
// device and start the engine thread.
//
// Pool size: cache.num_blocks when set; else what cache.memory_bytes holds;
// else room for scheduler.max_num_seqs sequences of max_model_len tokens,
// capped at kDefaultCpuKvBudget bytes (but never below one full sequence).
//
// Thread-safety: a pure function; may take seconds (weights are read).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "scheduler/engine.h"
#include "server/config.h"
#include "server/serving_state.h"

namespace kvserve {

inline constexpr int64_t kDefaultCpuKvBudget = int64_t{4} << 30;

struct BuiltEngine {
  std::unique_ptr<Engine> engine;
  ServedModelInfo info;
};

// on_request_finished goes into the EngineConfig (engine thread; must not block).
absl::StatusOr<BuiltEngine> BuildEngine(
    const ServeConfig& config, std::function<void(const RequestMetrics&)> on_request_finished);

}  // namespace kvserve
