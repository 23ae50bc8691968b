// CPU attention over a low-rank KV cache (Palu; model/lowrank/low_rank_kv.h):
// the pages of a layer hold, per group of kv heads and token, the latent
// [z_k | z_v] of the group's pre-RoPE K (rank_k values) and V (rank_v),
// its first stored-width values in the K row and the rest in the V row (KV
// format num_kv_heads = the groups, head_dim = the stored width), in any
// per-token KV format.
//
// Algorithm, per run of rows of one sequence: every key the rows attend is
// decoded once (DequantizeRow), reconstructed from its latent
// (k_group = mean + sum_r z_r B_k[g][r]), rotated at its cache index (RoPE after
// reconstruction; the latents are of unrotated keys) and scored against the
// rows' queries; V stays latent: row r's output for query head h is
// a = sum_j p_j z_v[j][group of h] (rank_v values), which the caller's
// output projection, folded with the V basis (W_o' = B_v^T W_o per head),
// turns into the residual update. V is never expanded.
// Keys sit at their cache index: with low-rank pages, a key's position is
// its cache index (no eviction, which moves entries).
//
// Thread-safety: reentrant; may run on disjoint row ranges from several threads.
#pragma once

#include <cstdint>

#include "kernels/cpu/layers/ops.h"
#include "kernels/paged_view.h"

namespace kvserve::cpu {

struct LowRankAttentionParams {
  const float* q = nullptr;  // [T][num_heads][head_dim], RoPE applied
  float* out = nullptr;      // [T][num_heads][rank_v]: each head's latent output
  PagedKvView kv;            // one layer of latents: [block][group][slot][stored width]
  BatchView batch;           // query_start, context_len, block_table
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // the model's kv heads
  int32_t head_dim = 0;
  int32_t group_heads = 0;         // kv heads per latent group
  int32_t rank_k = 0;              // rank_k + rank_v <= 2 * stored width
  int32_t rank_v = 0;              //   (kv.layout.head_dim)
  const float* k_basis = nullptr;  // [groups][rank_k][group_heads * head_dim]
  const float* k_mean = nullptr;   // [groups][group_heads * head_dim]; null: 0
  float scale = 0.0f;              // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;      // 0: full causal attention
  // RoPE of keys at their cache index: the table, and past it the same
  // angles from inv_freq ([head_dim / 2]) as the forward pass computes.
  const RopeTable* rope = nullptr;
  const float* inv_freq = nullptr;
  bool interleaved = false;
};

// Causal attention of rows [row_begin, row_end) over their sequences' cached
// latents (this step's rows already written). Aborts on inconsistent shapes.
void LowRankAttention(const LowRankAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu
