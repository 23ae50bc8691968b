// KV writes on the CPU, the pairs of kernels/cuda/kv/kv_write.h and
// kv_write_kc.h: each new token's K and V quantized per the layer's
// KvFormat (kernels/cpu/kv/kv_quant.h) into the slot slot_mapping names, and
// for layouts with tails (int4_kc, int2_kc: cache/format/kv_layout.h) the
// block flush before attention and the tail write after it:
//   int4_kc:  FlushKvBlocks -> PagedAttention -> WriteKvTails
//   others:   WriteKv -> PagedAttention
// kernels/cpu/kv/: these writes, the quantizers, and the block copies and slot
// moves of the cache manager (copy_blocks.h, move_slots.h).
//
// Thread-safety: reentrant; FlushKvBlocks may run on disjoint sequence
// ranges from several threads, WriteKvTails on disjoint row ranges.
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
  PagedKvView kv;              // one layer, written
  CpuIsa isa = CpuIsa::kAuto;  // kAuto: the process default
};

// Quantizes (per the format) and stores each row's K and V at its slot.
// Not for layouts with tails (aborts: see FlushKvBlocks).
void WriteKv(const KvWriteParams& p);

// int4_kc: this step's K/V and where they go: the blocks named by the block
// table and the tails named by batch.tail_ids (slot_mapping is not read).
struct KvBlockWriteParams {
  const float* k = nullptr;  // [T][num_kv_heads][head_dim], this step's rows
  const float* v = nullptr;  // [T][num_kv_heads][head_dim]
  BatchView batch;           // query_start, context_len, block_table, tail_ids
  PagedKvView kv;            // one layer with tails, written
  CpuIsa isa = CpuIsa::kAuto;
};

// Before attention: for sequences [seq_begin, seq_end), quantizes every block
// the step completes (first / bs <= k < context_len / bs) in one go from its
// rows (the tail's before the step's first new index, the step's after) into
// block_table[b][k]. Tails are only read.
void FlushKvBlocks(const KvBlockWriteParams& p, int32_t seq_begin, int32_t seq_end);

// After attention: writes rows [row_begin, row_end) that fall in their
// sequence's final partial block (context_len / bs * bs <= index) into its
// tail at slot index % bs.
void WriteKvTails(const KvBlockWriteParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu
