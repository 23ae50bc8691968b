// Plain, device-usable views of what a kernel reads each step: one layer of
// the paged KV cache (PagedKvView) and the flattened batch (BatchView).
// Pointers and sizes only, no std:: containers and no Abseil types, so the
// same structs are passed by value to CPU functions and CUDA kernels; the
// pointers are host memory for the CPU backend and device memory for CUDA.
// The index arithmetic every backend needs (which sequence owns a row, the
// cache index of a row, the keys it attends, where cache index i lives) is
// written once, here.
//
// Semantics (see kernels/batch_input.h): sequence b's new rows are
// query_start[b] .. query_start[b+1]-1; context_len[b] counts its cached
// tokens after this step's K/V are written, so its rows sit at cache indices
// context_len[b] - q_len .. context_len[b] - 1 and row r attends to cache
// indices [KeyBegin(i, window), i] (causal, optional sliding window).
//
// Example (host):
//   BatchView bv = ViewOf(batch);
//   const int32_t b = bv.SeqOfRow(r);
//   const int32_t i = bv.CacheIndex(b, r);
//   for (int32_t j = KeyBegin(i, window); j <= i; ++j) read(kv.Block(bv.BlockRow(b)[j / bs]) ...)
//
// Thread-safety: plain values; views do not own what they point to.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "cache/format/kv_pages.h"
#include "kernels/batch_input.h"

namespace kvserve {

// One layer of the paged KV cache.
struct PagedKvView {
  uint8_t* pages = nullptr;  // [num_blocks][layout.block_bytes]
  int32_t num_blocks = 0;
  KvPageLayout layout;
  // int4_kc: [num_tails][layout.tail.block_bytes] (cache/format/kv_layout.h); null
  // and 0 when the layout keeps no tails.
  uint8_t* tails = nullptr;
  int32_t num_tails = 0;

  KV_HOST_DEVICE uint8_t* Block(int32_t id) const {
    return pages + static_cast<int64_t>(id) * layout.block_bytes;
  }
  KV_HOST_DEVICE uint8_t* Tail(int32_t id) const {
    return tails + static_cast<int64_t>(id) * layout.tail.block_bytes;
  }
  // The block and in-block offset of a flat slot (block_id * block_size + offset).
  KV_HOST_DEVICE uint8_t* BlockOfSlot(int64_t slot) const {
    return pages + (slot / layout.block_size) * layout.block_bytes;
  }
};

struct BatchView {
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; negative: do not write
  const int32_t* query_start = nullptr;   // [num_seqs + 1], query_start[0] == 0
  const int32_t* context_len = nullptr;   // [num_seqs]
  const int32_t* block_table = nullptr;   // [num_seqs][max_blocks_per_seq]
  const int32_t* logits_rows = nullptr;   // [num_logits_rows], ascending
  const int32_t* tail_ids = nullptr;      // [num_seqs] or null (no tails); -1: none
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t num_logits_rows = 0;

  KV_HOST_DEVICE int32_t QueryLen(int32_t b) const { return query_start[b + 1] - query_start[b]; }
  // Cache index of sequence b's first new row.
  KV_HOST_DEVICE int32_t FirstIndex(int32_t b) const { return context_len[b] - QueryLen(b); }
  // Cache index of row r of sequence b.
  KV_HOST_DEVICE int32_t CacheIndex(int32_t b, int32_t r) const {
    return FirstIndex(b) + (r - query_start[b]);
  }
  KV_HOST_DEVICE const int32_t* BlockRow(int32_t b) const {
    return block_table + static_cast<int64_t>(b) * max_blocks_per_seq;
  }
  // Flat slot of cache index i of sequence b.
  KV_HOST_DEVICE int64_t Slot(int32_t b, int32_t i, int32_t block_size) const {
    return static_cast<int64_t>(BlockRow(b)[i / block_size]) * block_size + i % block_size;
  }
  // The sequence that owns row r: the last b with query_start[b] <= r
  // (binary search; sequences with no rows are skipped).
  KV_HOST_DEVICE int32_t SeqOfRow(int32_t r) const {
    int32_t lo = 0, hi = num_seqs;  // answer in [lo, hi)
    while (hi - lo > 1) {
      const int32_t mid = (lo + hi) / 2;
      if (query_start[mid] <= r) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
};

// First cache index a row at cache index i attends to: i - window + 1
// clamped at 0 with a sliding window (window > 0), else 0.
KV_HOST_DEVICE inline int32_t KeyBegin(int32_t i, int32_t sliding_window) {
  if (sliding_window <= 0) return 0;
  const int32_t lo = i - sliding_window + 1;
  return lo > 0 ? lo : 0;
}

// Keys a row at cache index i attends to.
KV_HOST_DEVICE inline int32_t NumKeys(int32_t i, int32_t sliding_window) {
  return i - KeyBegin(i, sliding_window) + 1;
}

// A view of a host BatchInput (pointers into its vectors; valid while the
// batch is neither modified nor destroyed).
inline BatchView ViewOf(const BatchInput& batch) {
  BatchView v;
  v.token_ids = batch.token_ids.data();
  v.positions = batch.positions.data();
  v.slot_mapping = batch.slot_mapping.data();
  v.query_start = batch.query_start.data();
  v.context_len = batch.context_len.data();
  v.block_table = batch.block_table.data();
  v.logits_rows = batch.logits_rows.data();
  v.tail_ids = batch.tail_ids.empty() ? nullptr : batch.tail_ids.data();
  v.num_tokens = batch.num_tokens();
  v.num_seqs = batch.num_seqs();
  v.max_blocks_per_seq = batch.max_blocks_per_seq;
  v.num_logits_rows = static_cast<int32_t>(batch.logits_rows.size());
  return v;
}

// One layer of host KV pages. Kernels that only read take it from a const
// object too; constness is the caller's promise, as with any view.
inline PagedKvView LayerView(const HostKvPages& kv, int layer) {
  PagedKvView v;
  v.pages = const_cast<uint8_t*>(kv.layer(layer));
  v.num_blocks = kv.num_blocks();
  v.layout = kv.format(layer).layout();
  v.tails = const_cast<uint8_t*>(kv.tails(layer));
  v.num_tails = v.tails != nullptr ? kv.num_tails() : 0;
  return v;
}

}  // namespace kvserve
