// Blocks for tokens: the one ceiling division of a token count by the block
// size, used wherever a pool, a block table or a plan counts blocks.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

namespace kvserve {

// Blocks of block_size tokens that num_tokens tokens fill (0 for 0 tokens).
// block_size > 0; the count fits in int32 for any context a model takes.
constexpr int32_t BlocksForTokens(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

}  // namespace kvserve
