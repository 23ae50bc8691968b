// WriteKv, and int4_kc's block flush and tail write (kv_write.h).
#include "kernels/cpu/kv/kv_write.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/kv/kc_tails.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {
namespace {

[[noreturn]] void Die(const char* what, int32_t b) {
  std::fprintf(stderr, "%s (sequence %d of the batch)\n", what, b);
  std::abort();
}

}  // namespace

namespace internal {

void RoundToTail(const KvPartLayout& tail_part, int hd, const float* x, float* out) {
  thread_local std::vector<uint8_t> bytes;
  bytes.resize(tail_part.row_bytes);
  QuantizeRow(tail_part, hd, x, bytes.data(), nullptr);
  DequantizeRow(tail_part, hd, bytes.data(), nullptr, out);
}

}  // namespace internal

using internal::RoundToTail;
using internal::TailPart;

void WriteKv(const KvWriteParams& p) {
  const KvPageLayout& f = p.kv.layout;
  if (f.has_tails()) {
    std::fprintf(stderr, "WriteKv: an int4_kc layer is written by FlushKvBlocks/WriteKvTails\n");
    std::abort();
  }
  const int hkv = f.num_kv_heads, hd = f.head_dim, bs = f.block_size;
  const CpuIsa isa = ResolveCpuIsa(p.isa);
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    uint8_t* block = p.kv.BlockOfSlot(slot);
    const int off = static_cast<int>(slot % bs);
    for (int h = 0; h < hkv; ++h) {
      const int64_t src = (int64_t(t) * hkv + h) * hd;
      QuantizeRow(f.k, hd, p.k + src, block + f.RowOffset(f.k, h, off),
                  block + f.MetaOffset(f.k, h, off), isa);
      QuantizeRow(f.v, hd, p.v + src, block + f.RowOffset(f.v, h, off),
                  block + f.MetaOffset(f.v, h, off), isa);
    }
  }
}

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

}  // namespace kvserve::cpu
