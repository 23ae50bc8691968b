#include "model/batch_check.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

absl::Status BadBatch(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("BatchInput: ", what));
}

}  // namespace

absl::Status ValidateBatch(const BatchInput& batch, const BatchLimits& limits) {
  const int64_t T = batch.num_tokens(), B = batch.num_seqs();
  if (static_cast<int64_t>(batch.positions.size()) != T) {
    return BadBatch(absl::StrCat("positions has ", batch.positions.size(), " entries, want ", T));
  }
  if (static_cast<int64_t>(batch.slot_mapping.size()) != T) {
    return BadBatch(
        absl::StrCat("slot_mapping has ", batch.slot_mapping.size(), " entries, want ", T));
  }
  if (static_cast<int64_t>(batch.query_start.size()) != B + 1 || batch.query_start[0] != 0 ||
      batch.query_start[B] != T) {
    return BadBatch(absl::StrCat("query_start must have num_seqs + 1 = ", B + 1,
                                 " entries from 0 to num_tokens = ", T));
  }
  if (batch.max_blocks_per_seq < 0 ||
      static_cast<int64_t>(batch.block_table.size()) < B * batch.max_blocks_per_seq) {
    return BadBatch(absl::StrCat(
        "block_table has ", batch.block_table.size(),
        " entries, want num_seqs * max_blocks_per_seq = ", B * batch.max_blocks_per_seq));
  }
  const int bs = limits.block_size;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t q_len = batch.query_start[b + 1] - batch.query_start[b];
    const int32_t ctx = batch.context_len[b];
    if (q_len < 0) return BadBatch(absl::StrCat("query_start decreases at sequence ", b));
    if (ctx < q_len) {
      return BadBatch(
          absl::StrCat("context_len[", b, "] = ", ctx, " is less than its ", q_len, " new tokens"));
    }
    if (q_len == 0) continue;
    const int64_t needed = (int64_t{ctx} + bs - 1) / bs;
    if (needed > batch.max_blocks_per_seq) {
      return BadBatch(absl::StrCat("context_len[", b, "] = ", ctx, " needs ", needed,
                                   " blocks but max_blocks_per_seq is ", batch.max_blocks_per_seq));
    }
    // Only blocks the attention window of this step's first row can reach
    // are read; earlier ones may already be released.
    const int32_t first = ctx - q_len;
    const int32_t lo =
        limits.sliding_window > 0 ? std::max(0, first - limits.sliding_window + 1) : 0;
    const int32_t* row = batch.BlockRow(static_cast<int32_t>(b));
    for (int64_t i = lo / bs; i < needed; ++i) {
      if (row[i] < 0 || row[i] >= limits.num_blocks) {
        return BadBatch(absl::StrCat("block_table[", b, "][", i, "] = ", row[i],
                                     " is not a block id (pool has ", limits.num_blocks, ")"));
      }
    }
  }
  const int64_t num_slots = int64_t{limits.num_blocks} * bs;
  for (int64_t t = 0; t < T; ++t) {
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= limits.vocab_size) {
      return BadBatch(absl::StrCat("token_ids[", t, "] = ", batch.token_ids[t],
                                   " is outside the vocabulary of ", limits.vocab_size));
    }
    if (batch.positions[t] < 0 || batch.positions[t] >= limits.max_positions) {
      return BadBatch(
          absl::StrCat("positions[", t, "] = ", batch.positions[t],
                       " is outside [0, max_position_embeddings = ", limits.max_positions, ")"));
    }
    if (batch.slot_mapping[t] >= num_slots) {
      return BadBatch(absl::StrCat("slot_mapping[", t, "] = ", batch.slot_mapping[t],
                                   " is past the last slot ", num_slots - 1));
    }
  }
  int32_t prev = -1;
  for (size_t i = 0; i < batch.logits_rows.size(); ++i) {
    const int32_t r = batch.logits_rows[i];
    if (r <= prev || r >= T) {
      return BadBatch(absl::StrCat("logits_rows[", i, "] = ", r,
                                   " is not ascending inside [0, num_tokens = ", T, ")"));
    }
    prev = r;
  }
  return absl::OkStatus();
}

}  // namespace kvserve
