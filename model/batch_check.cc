#include "model/batch_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"

namespace kvserve {
namespace {

absl::Status BadBatch(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("BatchInput: ", what));
}

// int4_kc: a step that reads or writes a partial block needs its sequence's
// tail (cache/format/kv_layout.h), and tails that are written are not shared.
absl::Status ValidateTails(const BatchInput& batch, const BatchLimits& limits) {
  const int32_t B = batch.num_seqs(), bs = limits.block_size;
  if (static_cast<int32_t>(batch.tail_ids.size()) != B) {
    return BadBatch(absl::StrCat("tail_ids has ", batch.tail_ids.size(),
                                 " entries, want one per sequence (", B,
                                 ") with an int4_kc cache"));
  }
  std::vector<int32_t> used;
  for (int32_t b = 0; b < B; ++b) {
    const int32_t q_len = batch.query_start[b + 1] - batch.query_start[b];
    const int32_t ctx = batch.context_len[b];
    if (q_len == 0) continue;
    const int32_t t = batch.tail_ids[b];
    const bool needed = (ctx - q_len) % bs != 0 || ctx % bs != 0;
    if (t == -1 && !needed) continue;
    if (t < 0 || t >= limits.num_tails) {
      return BadBatch(absl::StrCat("tail_ids[", b, "] = ", t, " is not a tail (the pool has ",
                                   limits.num_tails, ")",
                                   needed ? "; its step reads or writes a partial block" : ""));
    }
    used.push_back(t);
  }
  std::sort(used.begin(), used.end());
  if (std::adjacent_find(used.begin(), used.end()) != used.end()) {
    return BadBatch("two sequences of the step name the same tail");
  }
  return absl::OkStatus();
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
  if (!batch.num_sinks.empty() && static_cast<int64_t>(batch.num_sinks.size()) != B) {
    return BadBatch(absl::StrCat("num_sinks has ", batch.num_sinks.size(),
                                 " entries, want 0 or num_seqs = ", B));
  }
  if (!batch.attention_stats.empty() && static_cast<int64_t>(batch.attention_stats.size()) != B) {
    return BadBatch(absl::StrCat("attention_stats has ", batch.attention_stats.size(),
                                 " entries, want 0 or num_seqs = ", B));
  }
  for (size_t b = 0; b < batch.num_sinks.size(); ++b) {
    if (batch.num_sinks[b] < 0) {
      return BadBatch(absl::StrCat("num_sinks[", b, "] = ", batch.num_sinks[b], " is negative"));
    }
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
    const int64_t needed = BlocksForTokens(ctx, bs);
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
  if (limits.num_tails > 0) return ValidateTails(batch, limits);
  return absl::OkStatus();
}

void CheckSlotMoves(std::span<const SlotMove> moves, int64_t num_slots, const char* who) {
  for (const SlotMove& m : moves) {
    if (m.src < 0 || m.src >= num_slots || m.dst < 0 || m.dst >= num_slots) {
      std::fprintf(stderr, "%s: slot move %lld -> %lld outside the pool (%lld slots)\n", who,
                   static_cast<long long>(m.src), static_cast<long long>(m.dst),
                   static_cast<long long>(num_slots));
      std::abort();
    }
  }
}

}  // namespace kvserve
