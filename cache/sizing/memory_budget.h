// Sizing the KV block pools from the configuration, and the start-up check
// that one sequence of max_model_len fits.
//
// A block id names the same slot in every layer, so one block costs
// num_layers * KvFormat::block_bytes() bytes. The pool gets either an explicit
// block count (cache.num_blocks) or as many blocks as a byte budget holds
// (cache.memory_bytes). The CUDA backend turns cache.memory_fraction of free
// device memory after the weights into such a byte budget itself.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvserve {

// Bytes one block takes across all layers.
int64_t BytesPerBlock(int num_layers, int64_t block_bytes_per_layer);

// Blocks for a pool: num_blocks when > 0, else memory_bytes / BytesPerBlock.
// Errors (InvalidArgument) name the field: both unset or negative, or a
// budget below one block. `what` prefixes the field names ("cache").
absl::StatusOr<int32_t> PoolBlocksFromBudget(int32_t num_blocks, int64_t memory_bytes,
                                             int num_layers, int64_t block_bytes_per_layer,
                                             const char* what = "cache");

// Blocks of block_size tokens that one sequence of num_tokens needs.
int32_t BlocksForTokens(int64_t num_tokens, int32_t block_size);

// OK when one sequence of max_model_len tokens fits in num_blocks blocks;
// otherwise ResourceExhausted: "max_model_len 4096 needs 256 blocks of 16
// tokens; the pool has 100".
absl::Status CheckSequenceFits(int64_t max_model_len, int32_t block_size, int32_t num_blocks);

}  // namespace kvserve
