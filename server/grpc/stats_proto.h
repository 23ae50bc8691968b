// EngineStats (scheduler/engine_stats.h) as the gRPC API's kvserve.v1.Stats:
// the one place the engine's snapshot is converted for gRPC, as
// server/observability/metrics.cc is for Prometheus. The wire names predate EngineStats'
// KvCacheStats member and stay as they are for clients.
//
// Thread-safety: pure function.
#pragma once

#include "proto/kvserve.pb.h"
#include "scheduler/engine_stats.h"

namespace kvserve {

// Overwrites every field of `out`.
void ToProto(const EngineStats& s, v1::Stats* out);

}  // namespace kvserve
