// KV pool sizing: how many blocks the primary pool gets, from the cache
// settings and the memory left once the weights are loaded, for every
// backend. Plain arithmetic; the CUDA runner measures the inputs
// (cudaMemGetInfo after the weights, the workspaces and a profile forward at
// the largest batch, as vLLM's profile run does), the CPU factory reads
// MemAvailable.
//
// The first setting that is present wins:
//   cache.num_blocks       exactly that many blocks;
//   cache.memory_bytes     as many blocks as the bytes hold;
//   cache.memory_fraction  floor(fraction * (available - reserve)) bytes,
//                          where available is what is left after the
//                          weights and the activation peak;
//   neither (CUDA)         default_fraction (0.9) the same way;
//   neither (CPU)          room for max_num_seqs sequences of max_model_len,
//                          capped at default_bytes but never below one
//                          sequence.
// Then: with enforce_available, a pool larger than available - reserve is
// ResourceExhausted naming the setting; a pool that cannot hold one sequence
// of max_model_len is ResourceExhausted naming the setting and the numbers.
//
// Example (Llama-3-8B, int8 KV, block 16: 32 layers x 2 x 8 heads x 16 x
// (128 + 4) bytes = 1,081,344 bytes per block; 120 GiB available, reserve
// 1 GiB, fraction 0.9): floor(0.9 * 119 GiB) / 1,081,344 = 106,347 blocks,
// 1,701,552 tokens.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvserve {

struct KvPoolRequest {
  // cache.* (0: not set).
  int32_t num_blocks = 0;
  int64_t memory_bytes = 0;
  double memory_fraction = 0.0;
  // Backend defaults when none is set: a fraction (CUDA) or, when it is 0,
  // the CPU rule with default_bytes.
  double default_fraction = 0.0;
  int64_t default_bytes = 0;
  // Memory left after the weights and the activation peak; with
  // enforce_available an explicit pool must fit in available - reserve.
  int64_t available_bytes = 0;
  int64_t reserve_bytes = 0;
  bool enforce_available = false;
  // For messages and the log only.
  int64_t weight_bytes = 0;
  int64_t activation_bytes = 0;
  // Bytes the pool holds besides its blocks (int4_kc tails), taken off a
  // byte budget (memory_bytes, a fraction, the CPU default) first.
  int64_t fixed_bytes = 0;
  // The pool's shape.
  int64_t bytes_per_block = 0;  // one block id, all layers
  int32_t block_size = 0;
  int64_t max_model_len = 0;
  int32_t max_num_seqs = 1;
};

struct KvPoolPlan {
  int32_t num_blocks = 0;
  int64_t pool_bytes = 0;    // num_blocks * bytes_per_block
  int64_t num_tokens = 0;    // num_blocks * block_size
  int64_t budget_bytes = 0;  // what the deciding setting allowed
  std::string sized_from;    // "cache.num_blocks", "cache.memory_bytes",
                             // "cache.memory_fraction", "default"
};

absl::StatusOr<KvPoolPlan> PlanKvPool(const KvPoolRequest& request);

// One line for the start-up log: "KV pool: 53194 blocks x 2.06 MiB = 107.1
// GiB, 851104 tokens (cache.memory_fraction 0.9 of 120.0 GiB left after 15.0
// GiB of weights and 2.1 GiB of activations)".
std::string DescribeKvPool(const KvPoolRequest& request, const KvPoolPlan& plan);

}  // namespace kvserve
