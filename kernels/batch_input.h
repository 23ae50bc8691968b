// BatchInput: the one struct that crosses from the scheduler into a model
// backend each step (CPU and CUDA take exactly this). Flattened "varlen"
// layout: prefill chunks of many sequences and single decode tokens ride
// together.
//
// For sequence b, its new tokens are rows query_start[b] .. query_start[b+1]-1
// of the token arrays. context_len[b] counts the tokens in the cache after
// this step's K/V are written, so the new rows occupy cache indices
// context_len[b] - q_len .. context_len[b] - 1, and row r attends to cache
// indices 0 .. its own index (causal). Cache index i of sequence b lives at
// slot block_table[b * max_blocks_per_seq + i / block_size] * block_size +
// i % block_size; slot_mapping[t] names where row t's K/V is written.
// positions[t] is the RoPE position of row t (its token's position in the
// sequence; with eviction it exceeds the cache index, see
// cache/eviction/eviction_policy.h). tail_ids[b] names sequence b's tail (int4_kc
// keeps a partial last block there in full precision, cache/format/kv_layout.h), -1
// when it has none; empty when the cache keeps no tails.
#pragma once

#include <cstdint>
#include <vector>

namespace kvserve {

struct BatchInput {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int64_t> slot_mapping;  // [T]
  std::vector<int32_t> query_start;   // [B + 1], query_start[0] == 0
  std::vector<int32_t> context_len;   // [B]
  std::vector<int32_t> block_table;   // [B][max_blocks_per_seq], row-major
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logits_rows;  // rows of [T] whose logits are wanted, ascending
  std::vector<int32_t> tail_ids;     // [B] or empty (no tails)
  // KV eviction (cache/eviction/eviction_policy.h); each is empty unless a sequence of
  // the step needs it. num_sinks[b] > 0: streaming attention sinks, keys at
  // cache indices below it are scored with the row's query rotated at its
  // cache index (its in-cache position) instead of at positions[t].
  // attention_stats[b] != 0: record the attention sequence b's rows pay each
  // cache entry (ModelRunner::ReadAttentionStats).
  std::vector<int32_t> num_sinks;        // [B] or empty
  std::vector<uint8_t> attention_stats;  // [B] or empty

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_len.size()); }
  const int32_t* BlockRow(int32_t b) const {
    return block_table.data() + static_cast<int64_t>(b) * max_blocks_per_seq;
  }

  void Clear() {
    token_ids.clear();
    positions.clear();
    slot_mapping.clear();
    query_start.assign(1, 0);
    context_len.clear();
    block_table.clear();
    max_blocks_per_seq = 0;
    logits_rows.clear();
    tail_ids.clear();
    num_sinks.clear();
    attention_stats.clear();
  }
};

}  // namespace kvserve
