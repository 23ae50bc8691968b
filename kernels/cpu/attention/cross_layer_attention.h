// Cross-layer KV sharing on the CPU (cache.cross_layer, MiniCache-style; the
// page layout is in cache/format/kv_layout.h, the setting in
// cache/format/kv_cross_layer.h): the merge of a pair of layers' full blocks
// and the attention of either layer over them.
//
// Merge (MergeCrossLayerBlock, per token, per kv head, for K and V apart;
// K after RoPE, as every page stores it): with x_l and x_{l+1} the two
// layers' rows, m = |x| and u = x / m, the token's distance is the largest
// angle(u_l, u_{l+1}) / pi over its heads, K and V (1 where exactly one row
// is zero). Tokens above the threshold are candidates to stay unmerged; the
// layout's retain_slots of them with the largest distance (ties: the lower
// slot) keep x_l in the base page and x_{l+1} in the shared page's retention
// area (retention slots in slot order); every other token is merged: the
// base page gets m_l * e with e = (u_l + u_{l+1}) / |u_l + u_{l+1}| (the
// SLERP midpoint, t = 0.5; u_l when the sum vanishes), the shared page the
// fp16 ratio m_{l+1} / m_l (0 when m_l = 0). A head whose two rows are equal
// stores x_l itself and ratio 1, so equal layers reconstruct exactly (in an
// fp32 page, bit for bit). Distances use double sums, so they do not depend
// on the ISA.
//
// When (the engine's contract, as int4_kc's: kernels/cpu/attention/paged_attention.h):
// a block is merged once, when it fills (CrossLayerFlush, at the shared
// layer, before its attention); until then both layers keep its rows in fp32
// tails (cpu::WriteKvTails after each layer's attention). A row at cache
// index i reads the keys of earlier blocks from the pages (base: its page;
// shared: ratio * base row, or the retained row) and the keys of its own
// block in full precision (the tail below the step's first new index, this
// step's new rows from it on). So what a row sees depends on its index
// only, provided every block below a row's own block was flushed before the
// row's base-layer attention: the caller runs a step that crosses a block
// boundary as one round per block (model/cpu/cpu_forward.h).
//
// Thread-safety: reentrant; CrossLayerAttention may run on disjoint row
// ranges from several threads, CrossLayerFlush on disjoint sequence ranges.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/paged_view.h"

namespace kvserve::cpu {

// One full block's rows of both layers, token-major:
// [block_size][num_kv_heads][head_dim] each.
struct CrossLayerBlockRows {
  const float* base_k = nullptr;
  const float* base_v = nullptr;
  const float* shared_k = nullptr;
  const float* shared_v = nullptr;
};

// The distance of token t's rows (see above), in [0, 1].
float CrossLayerDistance(const CrossLayerBlockRows& rows, int num_kv_heads, int head_dim, int t);

// Writes one full block of a pair: base_block (base layout, kBase) and
// shared_block (kShared), every slot. Aborts on layouts that are not a pair.
void MergeCrossLayerBlock(const KvPageLayout& base, const KvPageLayout& shared,
                          const CrossLayerBlockRows& rows, float threshold, uint8_t* base_block,
                          uint8_t* shared_block, CpuIsa isa = CpuIsa::kAuto);

// What a merged block decodes to, token-major as CrossLayerBlockRows: layer
// l's rows (the base page's) and layer l+1's (ratio * base row, or the
// retained row). For tests and references.
void ReconstructCrossLayerBlock(const KvPageLayout& base, const KvPageLayout& shared,
                                const uint8_t* base_block, const uint8_t* shared_block,
                                float* base_k, float* base_v, float* shared_k, float* shared_v);

struct CrossLayerFlushParams {
  PagedKvView base;                 // layer l (kBase, with tails), written
  PagedKvView shared;               // layer l+1 (kShared, with tails), written
  BatchView batch;                  // query_start, context_len, block_table, tail_ids
  const float* base_k = nullptr;    // [T][num_kv_heads][head_dim]: layer l's rows this step
  const float* base_v = nullptr;    //   (K after RoPE)
  const float* shared_k = nullptr;  // [T][num_kv_heads][head_dim]: layer l+1's
  const float* shared_v = nullptr;
  float threshold = 0.0f;  // angle / pi
  CpuIsa isa = CpuIsa::kAuto;
};

// Merges every block that sequences [seq_begin, seq_end) complete this step
// (first / bs <= k < context_len / bs) from its rows: both tails' below the
// step's first new index, this step's after. Tails are only read.
void CrossLayerFlush(const CrossLayerFlushParams& p, int32_t seq_begin, int32_t seq_end);

struct CrossLayerAttentionParams {
  const float* q = nullptr;               // [T][num_heads][head_dim], RoPE applied
  float* out = nullptr;                   // [T][num_heads][head_dim]
  PagedKvView base;                       // the pair's base layer, read
  PagedKvView shared;                     // the pair's shared layer, read (any, for kBase)
  KvCrossRole role = KvCrossRole::kBase;  // which of the two attends
  BatchView batch;                        // query_start, context_len, block_table, tail_ids
  const float* new_k = nullptr;           // [T][num_kv_heads][head_dim]: the attending layer's
  const float* new_v = nullptr;           //   rows this step (RoPE applied)
  int32_t num_heads = 0;                  // query heads, a multiple of the kv heads
  float scale = 0.0f;                     // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;             // 0: full causal attention
};

// Causal attention of rows [row_begin, row_end) of the layer `role` names:
// for a merged token of the shared layer the score is ratio_k * (q . k_l)
// and its value ratio_v * v_l. Aborts on inconsistent shapes or a partial
// block without a tail.
void CrossLayerAttention(const CrossLayerAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu
