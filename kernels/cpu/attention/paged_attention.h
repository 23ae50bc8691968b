// CPU paged attention over every KvFormat (the KV writes it reads are
// kernels/cpu/kv/kv_write.h). Attention reads K/V
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
// int4_kc (a layout with tails, cache/format/kv_layout.h) writes in two calls
// around attention instead of WriteKv: FlushKvBlocks before it (quantizes
// each block the step completes), WriteKvTails after it (the step's rows of
// each sequence's final partial block into its tail); attention reads each
// row's own block in full precision from the tail and from new_k/new_v.
// Per layer:
//   int4_kc:  FlushKvBlocks -> PagedAttention -> WriteKvTails
//   others:   WriteKv -> PagedAttention
//
// Thread-safety: the functions are reentrant; PagedAttention may be called on
// disjoint row ranges from several threads, FlushKvBlocks on disjoint
// sequence ranges, WriteKvTails on disjoint row ranges.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv/kv_write.h"
#include "kernels/paged_view.h"

namespace kvserve::cpu {

struct PagedAttentionParams {
  const float* q = nullptr;    // [T][num_heads][head_dim], RoPE applied
  float* out = nullptr;        // [T][num_heads][head_dim]
  PagedKvView kv;              // one layer, read only
  BatchView batch;             // query_start, context_len, block_table
  int32_t num_heads = 0;       // query heads; GQA group = num_heads / num_kv_heads
  float scale = 0.0f;          // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;  // 0: full causal attention
  CpuIsa isa = CpuIsa::kAuto;  // kAuto: the process default
  // int4_kc only: this step's K and V, [T][num_kv_heads][head_dim] (RoPE
  // applied), from which rows read their own block's new keys.
  const float* new_k = nullptr;
  const float* new_v = nullptr;

  // Optional, for KV eviction (cache/eviction/eviction_policy.h); null: off.
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
// With int4_kc, keys of earlier blocks come from their quantized blocks and
// keys of the row's own block in full precision (tail, new_k/new_v), after
// FlushKvBlocks and before WriteKvTails.
// num_heads must be a multiple of the layout's num_kv_heads (aborts
// otherwise).
void PagedAttention(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu
