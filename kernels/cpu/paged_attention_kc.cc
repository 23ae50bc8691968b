// int4_kc on the CPU: the block flush before attention, the tail write after
// it, and the scalar reference attention (one decoded K or V row at a time,
// exact two-pass softmax, as PagedAttentionScalar). cache/kv_layout.h states
// which keys a row reads from where.
#include "kernels/cpu/paged_attention_kc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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
  thread_local std::vector<float> scores, row, acc, sums;
  row.resize(hd);
  sums.resize(group);
  acc.resize(static_cast<size_t>(group) * hd);
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t b = batch.SeqOfRow(r);
    const int32_t idx = batch.CacheIndex(b, r);
    const int32_t lo = KeyBegin(idx, p.sliding_window);
    const int32_t n = idx - lo + 1;
    const int32_t own = idx / bs;
    const int32_t* table = batch.BlockRow(b);
    const KcSeqView s = KcViewOf(p.kv, batch, b);
    if (s.first > own * bs && s.tail == nullptr) {
      std::fprintf(stderr, "PagedAttention: an int4_kc partial block has no tail\n");
      std::abort();
    }
    // Decodes key/value index j of kv head h into `row`.
    auto decode = [&](bool v, int h, int32_t j) {
      if (j / bs < own) {
        const uint8_t* block = p.kv.Block(table[j / bs]);
        const KvPartLayout& part = v ? f.v : f.k;
        const int64_t meta = v ? f.MetaOffset(f.v, h, j % bs) : f.BlockMetaOffset(f.k, h);
        DequantizeRow(part, hd, block + f.RowOffset(part, h, j % bs), block + meta, row.data());
      } else if (j < s.first) {
        DequantizeRow(tail_part, hd, s.TailRow(f, v, h, j), nullptr, row.data());
      } else {
        const float* src = s.NewRow(v ? p.new_v : p.new_k, hkv, hd, h, j);
        std::copy(src, src + hd, row.begin());
        // New rows at the tail's precision, as earlier steps' rows are.
        if (tail_part.elem != KvElem::kFp32) RoundToTail(tail_part, hd, row.data(), row.data());
      }
    };
    scores.resize(static_cast<size_t>(group) * n);
    for (int kvh = 0; kvh < hkv; ++kvh) {
      const float* q = p.q + (int64_t(r) * nh + kvh * group) * hd;  // [group][hd]
      for (int32_t i = lo; i <= idx; ++i) {
        decode(false, kvh, i);
        for (int g = 0; g < group; ++g) {
          float dot = 0.0f;
          for (int d = 0; d < hd; ++d) dot += q[g * hd + d] * row[d];
          scores[static_cast<size_t>(g) * n + (i - lo)] = dot * p.scale;
        }
      }
      for (int g = 0; g < group; ++g) {
        float* sc = scores.data() + static_cast<size_t>(g) * n;
        const float maxs = *std::max_element(sc, sc + n);
        float total = 0.0f;
        for (int32_t i = 0; i < n; ++i) {
          sc[i] = std::exp(sc[i] - maxs);
          total += sc[i];
        }
        sums[g] = total;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t i = lo; i <= idx; ++i) {
        decode(true, kvh, i);
        for (int g = 0; g < group; ++g) {
          const float w = scores[static_cast<size_t>(g) * n + (i - lo)];
          float* a = acc.data() + static_cast<size_t>(g) * hd;
          for (int d = 0; d < hd; ++d) a[d] += w * row[d];
        }
      }
      for (int g = 0; g < group; ++g) {
        float* out = p.out + (int64_t(r) * nh + kvh * group + g) * hd;
        const float inv = 1.0f / sums[g];
        for (int d = 0; d < hd; ++d) out[d] = acc[static_cast<size_t>(g) * hd + d] * inv;
      }
    }
  }
}

}  // namespace internal
}  // namespace kvserve::cpu
