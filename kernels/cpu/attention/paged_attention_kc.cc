// int4_kc and int2_kc attention on the CPU: the scalar reference (one decoded K or V row at a time,
// exact two-pass softmax, as PagedAttentionScalar). cache/format/kv_layout.h states
// which keys a row reads from where.
#include "kernels/cpu/attention/paged_attention_kc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention/attention_row_scalar.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {

namespace internal {

void PagedAttentionKcScalar(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end) {
  const KvPageLayout& f = p.kv.layout;
  const BatchView& batch = p.batch;
  const int hd = f.head_dim, bs = f.block_size, nh = p.num_heads;
  const int hkv = f.num_kv_heads, group = nh / hkv;
  const KvPartLayout tail_part = TailPart(f);
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t b = batch.SeqOfRow(r);
    const int32_t idx = batch.CacheIndex(b, r);
    const int32_t lo = KeyBegin(idx, p.sliding_window);
    const int32_t own = idx / bs;
    const int32_t* table = batch.BlockRow(b);
    const KcSeqView s = KcViewOf(p.kv, batch, b);
    if (s.first > own * bs && s.tail == nullptr) {
      std::fprintf(stderr, "PagedAttention: an int4_kc or int2_kc partial block has no tail\n");
      std::abort();
    }
    for (int kvh = 0; kvh < hkv; ++kvh) {
      const int64_t q_off = (int64_t(r) * nh + kvh * group) * hd;  // [group][hd]
      auto query = [&](int32_t) { return p.q + q_off; };
      // Key/value index j into `row`: quantized blocks, the tail, or this
      // step's new rows.
      auto decode = [&](bool v, int32_t j, float* row) {
        if (j / bs < own) {
          const uint8_t* block = p.kv.Block(table[j / bs]);
          const KvPartLayout& part = v ? f.v : f.k;
          const int64_t meta = v ? f.MetaOffset(f.v, kvh, j % bs) : f.BlockMetaOffset(f.k, kvh);
          DequantizeRow(part, hd, block + f.RowOffset(part, kvh, j % bs), block + meta, row);
        } else if (j < s.first) {
          DequantizeRow(tail_part, hd, s.TailRow(f, v, kvh, j), nullptr, row);
        } else {
          const float* src = s.NewRow(v ? p.new_v : p.new_k, hkv, hd, kvh, j);
          std::copy(src, src + hd, row);
          // New rows at the tail's precision, as earlier steps' rows are.
          if (tail_part.elem != KvElem::kFp32) RoundToTail(tail_part, hd, row, row);
        }
      };
      internal::AttendGroupScalar(group, hd, lo, idx, p.scale, query, decode, nullptr,
                                  p.out + q_off);
    }
  }
}

}  // namespace internal
}  // namespace kvserve::cpu
