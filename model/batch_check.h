// ValidateBatch: the one check of a BatchInput against a model and its KV
// pool, made by every backend before any K/V is written (a bad id read by a
// kernel would be an out-of-bounds access, on the device a fault for the
// whole process).
//
// Checks: array sizes (positions, slot_mapping, query_start, block_table),
// query_start from 0 to num_tokens and non-decreasing, context_len >= the new
// rows, block ids of every block the step's rows can reach inside the pool
// (blocks that left a sliding window may already be released and are not
// read), token ids inside the vocabulary, positions inside [0,
// max_positions), slots inside the pool (negative: not written), logits_rows
// ascending inside [0, num_tokens), num_sinks and attention_stats empty or
// one per sequence (num_sinks not negative); with an int4_kc cache
// (num_tails > 0, cache/format/kv_layout.h) one tail id per sequence, inside the
// tail pool for every sequence whose step reads or writes a partial block,
// and no two such sequences naming the same tail. InvalidArgument names the
// field ("BatchInput: token_ids[3] = 600 is outside the vocabulary of 512").
//
// CheckSlotMoves: the backends' one check of MoveSlots' moves against the
// pool, before any slot is moved.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "cache/block_copy.h"
#include "kernels/batch_input.h"

namespace kvserve {

struct BatchLimits {
  int32_t vocab_size = 0;
  int32_t max_positions = 0;  // RoPE table rows, or more where RoPE runs past its table
  int32_t num_blocks = 0;     // primary pool
  int32_t block_size = 0;
  int32_t sliding_window = 0;  // 0: full attention
  int32_t num_tails = 0;       // int4_kc tail pool; 0: no tails (tail_ids not read)
};

absl::Status ValidateBatch(const BatchInput& batch, const BatchLimits& limits);

// Aborts, naming `who` ("CpuModelRunner::MoveSlots"), when a move's source
// or destination is outside [0, num_slots): the scheduler computed it, so it
// is a bug, and moving it would write outside the pool.
void CheckSlotMoves(std::span<const SlotMove> moves, int64_t num_slots, const char* who);

}  // namespace kvserve
