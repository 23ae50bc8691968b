// Attention planning shared by the backends: how much attention work a step
// holds and how to cut its rows into ranges of about equal cost. The CPU
// model runs one range per task of its thread pool; the CUDA planner
// (kernels/plan/gpu_attention_plan.h) builds its split-KV work lists on the same
// key counts. Plain C++ over a host BatchView.
//
// Cost model: a row costs the keys it attends (KeyBegin..i, see
// kernels/paged_view.h) plus a fixed overhead for its setup, so one long
// prefill row and many short decode rows balance.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/paged_view.h"

namespace kvserve {

// Keys read by all query rows of the batch (per query head and layer).
int64_t CountAttentionKeys(const BatchView& batch, int32_t sliding_window);

// Splits rows [0, num_tokens) into `parts` contiguous ranges of about equal
// cost (keys + row_overhead per row). Returns parts + 1 ascending bounds,
// bounds[0] = 0 and bounds[parts] = num_tokens; a range may be empty when
// one row outweighs a share. parts is clamped to [1, max(1, num_tokens)].
std::vector<int32_t> SplitRowsByAttentionCost(const BatchView& batch, int32_t sliding_window,
                                              int parts, int64_t row_overhead);

}  // namespace kvserve
