// Internal to paged_attention.cc: attention over int4_kc pages (a layout
// with tails), the scalar reference and the AVX2 kernel, and where a key's
// full-precision row lives. Callers go through PagedAttention.
//
// Thread-safety: reentrant (scratch on the stack and in thread_local buffers).
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "kernels/cpu/paged_attention.h"

namespace kvserve::cpu::internal {

// Where sequence b's keys live for one step (cache/format/kv_layout.h): blocks below
// `own_block_of(i)` are quantized; the own block's index j is in the tail
// when j < first, else row new_row0 + (j - first) of new_k/new_v.
struct KcSeqView {
  int32_t first;        // first new cache index
  int32_t new_row0;     // batch row of index `first`
  const uint8_t* tail;  // the sequence's tail block (null: none)

  // Full-precision row of own-block index j for kv head h: K (v = false) or V.
  // fp32 rows come back as floats; fp16 tails are decoded by the caller.
  const uint8_t* TailRow(const KvPageLayout& f, bool v, int h, int32_t j) const {
    return tail + f.TailRowOffset(v, h, j % f.block_size);
  }
  const float* NewRow(const float* rows, int hkv, int hd, int h, int32_t j) const {
    return rows + (static_cast<int64_t>(new_row0 + j - first) * hkv + h) * hd;
  }
};

inline KcSeqView KcViewOf(const PagedKvView& kv, const BatchView& batch, int32_t b) {
  KcSeqView s;
  s.first = batch.FirstIndex(b);
  s.new_row0 = batch.query_start[b];
  const int32_t t = batch.tail_ids != nullptr ? batch.tail_ids[b] : -1;
  s.tail = t >= 0 ? kv.Tail(t) : nullptr;
  return s;
}

// Whether the AVX2 kernel handles this int4_kc shape: head_dim a multiple
// of 8 and at most 512, V groups a multiple of 8.
bool Avx2KcAttentionSupports(const KvPageLayout& f);

void PagedAttentionKcScalar(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);
void PagedAttentionKcAvx2(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu::internal
