#include "cache/sizing/memory_budget.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace kvserve {

int64_t BytesPerBlock(int num_layers, int64_t block_bytes_per_layer) {
  return static_cast<int64_t>(num_layers) * block_bytes_per_layer;
}

absl::StatusOr<int32_t> PoolBlocksFromBudget(int32_t num_blocks, int64_t memory_bytes,
                                             int num_layers, int64_t block_bytes_per_layer,
                                             const char* what) {
  if (num_layers <= 0 || block_bytes_per_layer <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot size ", what, " pool: ", num_layers,
                                                   " layers of ", block_bytes_per_layer,
                                                   "-byte blocks"));
  }
  if (num_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".num_blocks must not be negative, got ", num_blocks));
  }
  if (num_blocks > 0) return num_blocks;
  if (memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".memory_bytes must not be negative, got ", memory_bytes));
  }
  if (memory_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("set ", what, ".num_blocks or ", what, ".memory_bytes"));
  }
  const int64_t per_block = BytesPerBlock(num_layers, block_bytes_per_layer);
  const int64_t blocks = memory_bytes / per_block;
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".memory_bytes ", memory_bytes,
                                                   " is less than one block (", per_block,
                                                   " bytes over ", num_layers, " layers)"));
  }
  if (blocks > std::numeric_limits<int32_t>::max()) return std::numeric_limits<int32_t>::max();
  return static_cast<int32_t>(blocks);
}

int32_t BlocksForTokens(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

absl::Status CheckSequenceFits(int64_t max_model_len, int32_t block_size, int32_t num_blocks) {
  const int32_t needed = BlocksForTokens(max_model_len, block_size);
  if (needed <= num_blocks) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("max_model_len ", max_model_len, " needs ",
                                                   needed, " blocks of ", block_size,
                                                   " tokens; the pool has ", num_blocks));
}

}  // namespace kvserve
