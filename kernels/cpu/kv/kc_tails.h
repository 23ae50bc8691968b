// int4_kc's tails as the writes (kv_write.cc) and the attention kernels
// (attention/paged_attention_kc*.cc) both read them: where a sequence's
// full-precision rows live for one step, the tail's rows as a part layout,
// and a row rounded as the tail stores it. Internal to kernels/cpu.
//
// Thread-safety: plain values; RoundToTail uses a thread_local scratch.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "kernels/paged_view.h"

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

// The tail's rows as a part layout, for QuantizeRow / DequantizeRow.
inline KvPartLayout TailPart(const KvPageLayout& f) {
  KvPartLayout part;
  part.elem = f.tail.elem;
  part.row_bytes = f.tail.row_bytes;
  part.group_size = f.head_dim;
  return part;
}

// x as the tail would store it (fp16 tails: saturated and rounded); x may
// alias out.
void RoundToTail(const KvPartLayout& tail_part, int hd, const float* x, float* out);

}  // namespace kvserve::cpu::internal
