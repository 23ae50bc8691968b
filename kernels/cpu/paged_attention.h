// CPU paged attention and KV write over every KvFormat. Attention reads K/V
// only through block tables (no contiguous per-sequence buffers); quantized
// pages are dequantized in registers, never into a full copy.
//
// Thread-safety: the functions are reentrant; PagedAttention may be called on
// disjoint row ranges from several threads.
#pragma once

#include <cstdint>

#include "cache/kv_format.h"
#include "kernels/batch_input.h"

namespace kvserve::cpu {

struct KvWriteParams {
  const float* k = nullptr;             // [T][num_kv_heads][head_dim]
  const float* v = nullptr;             // [T][num_kv_heads][head_dim]
  const int64_t* slot_mapping = nullptr;  // [T]; negative: skip the row
  int32_t num_tokens = 0;
  uint8_t* kv_layer = nullptr;          // [num_blocks][block_bytes] of one layer
  const KvFormat* format = nullptr;
};

// Quantizes (per the format) and stores each row's K and V at its slot.
void WriteKv(const KvWriteParams& p);

struct PagedAttentionParams {
  const float* q = nullptr;             // [T][num_heads][head_dim], RoPE applied
  float* out = nullptr;                 // [T][num_heads][head_dim]
  const uint8_t* kv_layer = nullptr;    // [num_blocks][block_bytes] of one layer
  const KvFormat* format = nullptr;
  const BatchInput* batch = nullptr;    // query_start, context_len, block_table
  int32_t num_heads = 0;                // query heads; GQA group = num_heads / num_kv_heads
  float scale = 0.0f;                   // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;           // 0: full causal attention
};

// Causal attention of every query row over its sequence's cached K/V (which
// must already hold this step's rows). Computes rows [row_begin, row_end).
void PagedAttention(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu
