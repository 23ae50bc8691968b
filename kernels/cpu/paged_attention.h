// CPU paged attention and KV write over every KvFormat. Attention reads K/V
// only through block tables (no contiguous per-sequence buffers); quantized
// pages are dequantized in registers, never into a full copy.
//
// Paths: AVX2+FMA+F16C kernels when the CPU has them (head_dim a multiple of
// 8, int4 groups a multiple of 8, head_dim <= 512), else portable scalar code
// for any even head_dim. KVSERVE_CPU_ISA=scalar forces the scalar path
// (see cpu_features.h); `isa` in the params does the same per call.
//
// Algorithm (both paths): each (row, kv head) pair walks the row's cache
// indices block by block and serves the query heads of its GQA group (the
// AVX2 path in sub-groups of up to 4) from each decoded K/V row. The AVX2 path keeps scores of up
// to 256 keys in a stack tile and merges tiles with an online softmax (running max, rescaled sums),
// so long contexts need no heap buffer and short ones do one pass.
//
// Thread-safety: the functions are reentrant; PagedAttention may be called on
// disjoint row ranges from several threads.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/paged_view.h"

namespace kvserve::cpu {

struct KvWriteParams {
  const float* k = nullptr;               // [T][num_kv_heads][head_dim]
  const float* v = nullptr;               // [T][num_kv_heads][head_dim]
  const int64_t* slot_mapping = nullptr;  // [T]; negative: skip the row
  int32_t num_tokens = 0;
  PagedKvView kv;               // one layer, written
  CpuIsa isa = CpuIsa::kAuto;  // kAuto: the process default
};

// Quantizes (per the format) and stores each row's K and V at its slot.
void WriteKv(const KvWriteParams& p);

struct PagedAttentionParams {
  const float* q = nullptr;           // [T][num_heads][head_dim], RoPE applied
  float* out = nullptr;               // [T][num_heads][head_dim]
  PagedKvView kv;                     // one layer, read only
  BatchView batch;                    // query_start, context_len, block_table
  int32_t num_heads = 0;              // query heads; GQA group = num_heads / num_kv_heads
  float scale = 0.0f;                 // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;         // 0: full causal attention
  CpuIsa isa = CpuIsa::kAuto;         // kAuto: the process default

  // Optional, for KV eviction (cache/eviction_policy.h); null: off.
  // Streaming attention sinks: a row of sequence b scores the keys at cache
  // indices below num_sinks[b] with its sink_q row (the query rotated at
  // the row's in-cache position) instead of q.
  const float* sink_q = nullptr;       // [T][num_heads][head_dim], RoPE applied
  const int32_t* num_sinks = nullptr;  // [num_seqs]
  // Attention statistics, in the same pass: row r with key_mass_offset[r]
  // >= 0 stores at key_mass[key_mass_offset[r] + (j - KeyBegin(i))] the
  // softmax weight of its key at cache index j summed over the row's query
  // heads (each head's weights sum to 1), for every key it attends.
  float* key_mass = nullptr;                 // [sum of the recorded rows' keys]
  const int64_t* key_mass_offset = nullptr;  // [T]; negative: not recorded
};

// Causal attention of every query row over its sequence's cached K/V (which
// must already hold this step's rows). Computes rows [row_begin, row_end).
// Row r of sequence b sits at cache index i = batch.CacheIndex(b, r) and
// attends to indices [KeyBegin(i, sliding_window), i] (kernels/paged_view.h).
// num_heads must be a multiple of the layout's num_kv_heads (aborts
// otherwise).
void PagedAttention(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu
