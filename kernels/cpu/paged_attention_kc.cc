// int4_kc and int2_kc on the CPU: the block flush before attention, the tail write after
// it, and the scalar reference attention (one decoded K or V row at a time,
// exact two-pass softmax, as PagedAttentionScalar). cache/format/kv_layout.h states
// which keys a row reads from where.
#include "kernels/cpu/paged_attention_kc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_row_scalar.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/paged_attention.h"

namespace kvserve::cpu {
namespace {

[[noreturn]] void Die(const char* what, int32_t b) {
  std::fprintf(stderr, "%s (sequence %d of the batch)\n", what, b);
  std::abort();
}

// The tail's rows as a part layout, for QuantizeRow / DequantizeRow.
KvPartLayout TailPart(const KvPageLayout& f) {
  KvPartLayout part;
  part.elem = f.tail.elem;
  part.row_bytes = f.tail.row_bytes;
  part.group_size = f.head_dim;
  return part;
}

// x as the tail would store it (fp16 tails: saturated and rounded).
void RoundToTail(const KvPartLayout& tail_part, int hd, const float* x, float* out) {
  thread_local std::vector<uint8_t> bytes;
  bytes.resize(tail_part.row_bytes);
  QuantizeRow(tail_part, hd, x, bytes.data(), nullptr);
  DequantizeRow(tail_part, hd, bytes.data(), nullptr, out);
}

}  // namespace

void FlushKvBlocks(const KvBlockWriteParams& p, int32_t seq_begin, int32_t seq_end) {
  const KvPageLayout& f = p.kv.layout;
  if (!f.has_tails()) {
    std::fprintf(stderr, "FlushKvBlocks: the layer keeps no tails (use WriteKv)\n");
    std::abort();
  }
  const int hd = f.head_dim, bs = f.block_size, hkv = f.num_kv_heads;
  const KvPartLayout tail_part = TailPart(f);
  const bool fp32_tail = f.tail.elem == KvElem::kFp32;
  thread_local std::vector<const float*> rows;
  thread_local std::vector<float> decoded;  // fp16 tail rows, [bs][hd]
  rows.resize(bs);
  decoded.resize(static_cast<size_t>(bs) * hd);
  for (int32_t b = seq_begin; b < seq_end; ++b) {
    if (p.batch.QueryLen(b) == 0) continue;
    const internal::KcSeqView s = internal::KcViewOf(p.kv, p.batch, b);
    const int32_t ctx = p.batch.context_len[b];
    for (int32_t k = s.first / bs; k < ctx / bs; ++k) {
      if (s.first > k * bs && s.tail == nullptr)
        Die("FlushKvBlocks: a partial block has no tail", b);
      uint8_t* block = p.kv.Block(p.batch.BlockRow(b)[k]);
      for (int h = 0; h < hkv; ++h) {
        for (bool v : {false, true}) {
          for (int j = 0; j < bs; ++j) {
            const int32_t i = k * bs + j;
            if (i >= s.first) {
              rows[j] = s.NewRow(v ? p.v : p.k, hkv, hd, h, i);
            } else if (fp32_tail) {
              rows[j] = reinterpret_cast<const float*>(s.TailRow(f, v, h, i));
            } else {
              float* out = decoded.data() + static_cast<size_t>(j) * hd;
              DequantizeRow(tail_part, hd, s.TailRow(f, v, h, i), nullptr, out);
              rows[j] = out;
            }
            if (!fp32_tail && i >= s.first) {
              // The block holds what the tail would have: new rows at its precision.
              float* out = decoded.data() + static_cast<size_t>(j) * hd;
              RoundToTail(tail_part, hd, rows[j], out);
              rows[j] = out;
            }
          }
          if (!v) {
            QuantizeBlockKChannel(f.k, hd, bs, rows.data(), block + f.RowOffset(f.k, h, 0),
                                  block + f.BlockMetaOffset(f.k, h), p.isa);
          } else {
            for (int j = 0; j < bs; ++j) {
              QuantizeRow(f.v, hd, rows[j], block + f.RowOffset(f.v, h, j),
                          block + f.MetaOffset(f.v, h, j), p.isa);
            }
          }
        }
      }
    }
  }
}

void WriteKvTails(const KvBlockWriteParams& p, int32_t row_begin, int32_t row_end) {
  const KvPageLayout& f = p.kv.layout;
  if (!f.has_tails()) {
    std::fprintf(stderr, "WriteKvTails: the layer keeps no tails (use WriteKv)\n");
    std::abort();
  }
  const int hd = f.head_dim, bs = f.block_size, hkv = f.num_kv_heads;
  const KvPartLayout tail_part = TailPart(f);
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t b = p.batch.SeqOfRow(r);
    const int32_t i = p.batch.CacheIndex(b, r);
    if (i < p.batch.context_len[b] / bs * bs) continue;  // its block is full: flushed
    const int32_t t = p.batch.tail_ids != nullptr ? p.batch.tail_ids[b] : -1;
    if (t < 0) Die("WriteKvTails: a partial block has no tail", b);
    uint8_t* tail = p.kv.Tail(t);
    for (int h = 0; h < hkv; ++h) {
      const int64_t src = (static_cast<int64_t>(r) * hkv + h) * hd;
      QuantizeRow(tail_part, hd, p.k + src, tail + f.TailRowOffset(false, h, i % bs), nullptr,
                  p.isa);
      QuantizeRow(tail_part, hd, p.v + src, tail + f.TailRowOffset(true, h, i % bs), nullptr,
                  p.isa);
    }
  }
}

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
