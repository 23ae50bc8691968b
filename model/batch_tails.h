// Checks the int4_kc part of a BatchInput: with a cache that keeps tails
// (cache/kv_layout.h), every sequence whose step reads or writes a partial
// block (its first new index or its context length not a multiple of the
// block size) must name a tail of the pool, and no two such sequences the
// same one.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/batch_input.h"

namespace kvserve {

// InvalidArgument naming tail_ids ("BatchInput: tail_ids[2] = -1 ...").
absl::Status ValidateBatchTails(const BatchInput& batch, int32_t num_tails, int32_t block_size);

}  // namespace kvserve
