#include "kernels/cpu/attention/cross_layer_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/attention/attention_row_scalar.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "cross-layer KV: %s\n", what);
  std::abort();
}

void CheckPair(const KvPageLayout& base, const KvPageLayout& shared) {
  if (base.cross.role != KvCrossRole::kBase || shared.cross.role != KvCrossRole::kShared ||
      base.num_kv_heads != shared.num_kv_heads || base.head_dim != shared.head_dim ||
      base.block_size != shared.block_size || !base.has_tails() || !shared.has_tails() ||
      base.tail.elem != KvElem::kFp32 || shared.tail.elem != KvElem::kFp32) {
    Die("the layouts are not a base and a shared layer of one shape with fp32 tails");
  }
}

// The angle between a and b over pi, in double; 0 for equal rows, 1 when
// exactly one is zero.
double Distance(const float* a, const float* b, int n) {
  double ab = 0, aa = 0, bb = 0;
  bool equal = true;
  for (int e = 0; e < n; ++e) {
    ab += double{a[e]} * b[e];
    aa += double{a[e]} * a[e];
    bb += double{b[e]} * b[e];
    equal = equal && a[e] == b[e];
  }
  if (equal) return 0.0;
  if (aa == 0.0 || bb == 0.0) return 1.0;
  const double c = std::clamp(ab / std::sqrt(aa * bb), -1.0, 1.0);
  return std::acos(c) / M_PI;
}

float Norm(const float* x, int n) {
  double s = 0;
  for (int e = 0; e < n; ++e) s += double{x[e]} * x[e];
  return static_cast<float>(std::sqrt(s));
}

// One head's merged base row into out, and the ratio m_{l+1} / m_l.
float MergeRow(const float* x1, const float* x2, int n, float* out) {
  if (std::equal(x1, x1 + n, x2)) {
    std::copy(x1, x1 + n, out);
    return 1.0f;
  }
  const float m1 = Norm(x1, n), m2 = Norm(x2, n);
  if (m1 == 0.0f) {
    std::fill(out, out + n, 0.0f);
    return 0.0f;
  }
  if (m2 == 0.0f) {
    std::copy(x1, x1 + n, out);
    return 0.0f;
  }
  double ss = 0;
  for (int e = 0; e < n; ++e) {
    const double s = double{x1[e]} / m1 + double{x2[e]} / m2;
    ss += s * s;
  }
  if (ss == 0.0) {  // opposite directions: keep layer l's
    std::copy(x1, x1 + n, out);
  } else {
    const double k = double{m1} / std::sqrt(ss);
    for (int e = 0; e < n; ++e) {
      out[e] = static_cast<float>((double{x1[e]} / m1 + double{x2[e]} / m2) * k);
    }
  }
  return std::min(m2 / m1, kFp16Max);
}

void PutFp16(uint8_t* p, float x) {
  const uint16_t h = FloatToFp16(x);
  std::memcpy(p, &h, 2);
}
float GetFp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFloat(h);
}

KvPartLayout TailPart(const KvPageLayout& f) {
  KvPartLayout part;
  part.elem = KvElem::kFp32;
  part.row_bytes = f.tail.row_bytes;
  part.group_size = f.head_dim;
  return part;
}

}  // namespace

float CrossLayerDistance(const CrossLayerBlockRows& rows, int num_kv_heads, int head_dim, int t) {
  double d = 0;
  const int64_t off = static_cast<int64_t>(t) * num_kv_heads * head_dim;
  for (int h = 0; h < num_kv_heads; ++h) {
    const int64_t o = off + int64_t{h} * head_dim;
    d = std::max(d, Distance(rows.base_k + o, rows.shared_k + o, head_dim));
    d = std::max(d, Distance(rows.base_v + o, rows.shared_v + o, head_dim));
  }
  return static_cast<float>(d);
}

void MergeCrossLayerBlock(const KvPageLayout& base, const KvPageLayout& shared,
                          const CrossLayerBlockRows& rows, float threshold, uint8_t* base_block,
                          uint8_t* shared_block, CpuIsa isa) {
  CheckPair(base, shared);
  const int bs = base.block_size, hkv = base.num_kv_heads, hd = base.head_dim;
  thread_local std::vector<float> dist, merged;
  thread_local std::vector<int> order;
  dist.resize(bs);
  merged.resize(hd);
  order.clear();
  for (int t = 0; t < bs; ++t) {
    dist[t] = CrossLayerDistance(rows, hkv, hd, t);
    if (dist[t] > threshold) order.push_back(t);
  }
  // The retain_slots farthest candidates (ties: the lower slot), then in slot order.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return dist[a] > dist[b]; });
  if (static_cast<int>(order.size()) > shared.cross.retain_slots) {
    order.resize(shared.cross.retain_slots);
  }
  std::sort(order.begin(), order.end());
  uint8_t* index = shared_block + shared.cross.index_offset;
  std::fill(index, index + bs, kCrossMerged);
  for (size_t r = 0; r < order.size(); ++r) index[order[r]] = static_cast<uint8_t>(r);
  for (int t = 0; t < bs; ++t) {
    const int64_t off = static_cast<int64_t>(t) * hkv * hd;
    for (int h = 0; h < hkv; ++h) {
      const int64_t o = off + int64_t{h} * hd;
      for (int part = 0; part < 2; ++part) {
        const bool v = part == 1;
        const KvPartLayout& bp = v ? base.v : base.k;
        const KvPartLayout& sp = v ? shared.v : shared.k;
        const float* x1 = (v ? rows.base_v : rows.base_k) + o;
        const float* x2 = (v ? rows.shared_v : rows.shared_k) + o;
        uint8_t* ratio = shared_block + shared.RatioOffset(t, h) + 2 * part;
        uint8_t* bmeta = bp.meta_bytes ? base_block + base.MetaOffset(bp, h, t) : nullptr;
        if (index[t] != kCrossMerged) {
          QuantizeRow(bp, hd, x1, base_block + base.RowOffset(bp, h, t), bmeta, isa);
          const int r = index[t];
          uint8_t* smeta =
              sp.meta_bytes ? shared_block + shared.RetainedMetaOffset(sp, h, r) : nullptr;
          QuantizeRow(sp, hd, x2, shared_block + shared.RetainedRowOffset(sp, h, r), smeta, isa);
          PutFp16(ratio, 0.0f);
          continue;
        }
        PutFp16(ratio, MergeRow(x1, x2, hd, merged.data()));
        QuantizeRow(bp, hd, merged.data(), base_block + base.RowOffset(bp, h, t), bmeta, isa);
      }
    }
  }
}

void ReconstructCrossLayerBlock(const KvPageLayout& base, const KvPageLayout& shared,
                                const uint8_t* base_block, const uint8_t* shared_block,
                                float* base_k, float* base_v, float* shared_k, float* shared_v) {
  CheckPair(base, shared);
  const int bs = base.block_size, hkv = base.num_kv_heads, hd = base.head_dim;
  const uint8_t* index = shared_block + shared.cross.index_offset;
  for (int t = 0; t < bs; ++t) {
    for (int h = 0; h < hkv; ++h) {
      const int64_t o = (static_cast<int64_t>(t) * hkv + h) * hd;
      for (int part = 0; part < 2; ++part) {
        const bool v = part == 1;
        const KvPartLayout& bp = v ? base.v : base.k;
        const KvPartLayout& sp = v ? shared.v : shared.k;
        float* x1 = (v ? base_v : base_k) + o;
        float* x2 = (v ? shared_v : shared_k) + o;
        DequantizeRow(bp, hd, base_block + base.RowOffset(bp, h, t),
                      base_block + base.MetaOffset(bp, h, t), x1);
        if (index[t] != kCrossMerged) {
          const int r = index[t];
          DequantizeRow(sp, hd, shared_block + shared.RetainedRowOffset(sp, h, r),
                        shared_block + shared.RetainedMetaOffset(sp, h, r), x2);
        } else {
          const float ratio = GetFp16(shared_block + shared.RatioOffset(t, h) + 2 * part);
          for (int e = 0; e < hd; ++e) x2[e] = ratio * x1[e];
        }
      }
    }
  }
}

void CrossLayerFlush(const CrossLayerFlushParams& p, int32_t seq_begin, int32_t seq_end) {
  const KvPageLayout& bl = p.base.layout;
  const KvPageLayout& sl = p.shared.layout;
  CheckPair(bl, sl);
  const int bs = bl.block_size, hkv = bl.num_kv_heads, hd = bl.head_dim;
  const int64_t width = int64_t{hkv} * hd;
  thread_local std::vector<float> rows;
  rows.resize(4 * bs * width);
  const CrossLayerBlockRows block_rows{rows.data(), rows.data() + bs * width,
                                       rows.data() + 2 * bs * width, rows.data() + 3 * bs * width};
  for (int32_t b = seq_begin; b < seq_end; ++b) {
    const int32_t q_len = p.batch.QueryLen(b);
    if (q_len == 0) continue;
    const int32_t first = p.batch.FirstIndex(b), ctx = p.batch.context_len[b];
    const int32_t t_id = p.batch.tail_ids != nullptr ? p.batch.tail_ids[b] : -1;
    const int32_t* table = p.batch.BlockRow(b);
    for (int32_t k = first / bs; k < ctx / bs; ++k) {
      for (int32_t i = k * bs; i < (k + 1) * bs; ++i) {
        const int slot = i % bs;
        for (int part = 0; part < 4; ++part) {
          const bool v = part % 2 == 1, upper = part >= 2;
          float* dst = rows.data() + (int64_t{part} * bs + slot) * width;
          if (i >= first) {
            const float* src = upper ? (v ? p.shared_v : p.shared_k) : (v ? p.base_v : p.base_k);
            src += (static_cast<int64_t>(p.batch.query_start[b]) + (i - first)) * width;
            std::copy(src, src + width, dst);
            continue;
          }
          if (t_id < 0) Die("a partial block has no tail");
          const PagedKvView& view = upper ? p.shared : p.base;
          const uint8_t* tail = view.Tail(t_id);
          for (int h = 0; h < hkv; ++h) {
            std::memcpy(dst + int64_t{h} * hd, tail + view.layout.TailRowOffset(v, h, slot),
                        sizeof(float) * hd);
          }
        }
      }
      MergeCrossLayerBlock(bl, sl, block_rows, p.threshold, p.base.Block(table[k]),
                           p.shared.Block(table[k]), p.isa);
    }
  }
}

void CrossLayerAttention(const CrossLayerAttentionParams& p, int32_t row_begin, int32_t row_end) {
  if (row_begin >= row_end) return;
  const KvPageLayout& bl = p.base.layout;
  const KvPageLayout& sl = p.shared.layout;
  const bool upper = p.role == KvCrossRole::kShared;
  if (upper) CheckPair(bl, sl);
  const KvPageLayout& own_layout = upper ? sl : bl;
  const PagedKvView& own_view = upper ? p.shared : p.base;
  if (bl.cross.role != KvCrossRole::kBase || !own_layout.has_tails() || p.num_heads <= 0 ||
      p.num_heads % bl.num_kv_heads != 0) {
    Die("CrossLayerAttention: inconsistent shapes");
  }
  const BatchView& batch = p.batch;
  const int bs = bl.block_size, hkv = bl.num_kv_heads, hd = bl.head_dim, nh = p.num_heads;
  const int q_per_kv = nh / hkv;
  const int64_t width = int64_t{hkv} * hd;
  const KvPartLayout tail_part = TailPart(own_layout);
  thread_local std::vector<float> keys, vals;
  for (int32_t r = row_begin; r < row_end;) {
    const int32_t b = batch.SeqOfRow(r);
    const int32_t seq_end = std::min(row_end, batch.query_start[b + 1]);
    const int32_t first = batch.FirstIndex(b);
    const int32_t t_id = batch.tail_ids != nullptr ? batch.tail_ids[b] : -1;
    const int32_t* table = batch.BlockRow(b);
    // Rows of one own block share their decoded keys.
    const int32_t own = batch.CacheIndex(b, r) / bs;
    int32_t group_end = r;
    while (group_end < seq_end && batch.CacheIndex(b, group_end) / bs == own) ++group_end;
    const int32_t last = batch.CacheIndex(b, group_end - 1);
    const int32_t lo = KeyBegin(batch.CacheIndex(b, r), p.sliding_window);
    const int32_t n = last - lo + 1;
    keys.resize(static_cast<size_t>(n) * width);
    vals.resize(static_cast<size_t>(n) * width);
    if (first > own * bs && t_id < 0) Die("CrossLayerAttention: a partial block has no tail");
    for (int32_t j = lo; j <= last; ++j) {
      float* kr = keys.data() + static_cast<size_t>(j - lo) * width;
      float* vr = vals.data() + static_cast<size_t>(j - lo) * width;
      if (j / bs == own) {  // full precision: the tail, or this step's rows
        if (j >= first) {
          const int64_t src = (static_cast<int64_t>(batch.query_start[b]) + (j - first)) * width;
          std::copy(p.new_k + src, p.new_k + src + width, kr);
          std::copy(p.new_v + src, p.new_v + src + width, vr);
          continue;
        }
        const uint8_t* tail = own_view.Tail(t_id);
        for (int h = 0; h < hkv; ++h) {
          DequantizeRow(tail_part, hd, tail + own_layout.TailRowOffset(false, h, j % bs), nullptr,
                        kr + int64_t{h} * hd);
          DequantizeRow(tail_part, hd, tail + own_layout.TailRowOffset(true, h, j % bs), nullptr,
                        vr + int64_t{h} * hd);
        }
        continue;
      }
      const int slot = j % bs;
      const uint8_t* bblock = p.base.Block(table[j / bs]);
      const uint8_t* sblock = upper ? p.shared.Block(table[j / bs]) : nullptr;
      const uint8_t idx = upper ? sblock[sl.cross.index_offset + slot] : kCrossMerged;
      for (int h = 0; h < hkv; ++h) {
        for (int part = 0; part < 2; ++part) {
          const bool v = part == 1;
          float* out = (v ? vr : kr) + int64_t{h} * hd;
          if (upper && idx != kCrossMerged) {
            const KvPartLayout& sp = v ? sl.v : sl.k;
            DequantizeRow(sp, hd, sblock + sl.RetainedRowOffset(sp, h, idx),
                          sblock + sl.RetainedMetaOffset(sp, h, idx), out);
            continue;
          }
          const KvPartLayout& bp = v ? bl.v : bl.k;
          DequantizeRow(bp, hd, bblock + bl.RowOffset(bp, h, slot),
                        bblock + bl.MetaOffset(bp, h, slot), out);
          if (upper) {
            // Merged: layer l+1 is ratio * the base row (applied to the score
            // and the value alike, so it is folded into the decoded row).
            const float ratio = GetFp16(sblock + sl.RatioOffset(slot, h) + 2 * part);
            for (int e = 0; e < hd; ++e) out[e] *= ratio;
          }
        }
      }
    }
    for (int32_t row = r; row < group_end; ++row) {
      const int32_t idx = batch.CacheIndex(b, row);
      for (int kvh = 0; kvh < hkv; ++kvh) {
        const float* q = p.q + (static_cast<size_t>(row) * nh + kvh * q_per_kv) * hd;
        auto decode = [&](bool v, int32_t j, float* out) {
          const float* src = (v ? vals : keys).data() + static_cast<size_t>(j - lo) * width;
          std::copy(src + kvh * hd, src + (kvh + 1) * hd, out);
        };
        internal::AttendGroupScalar(
            q_per_kv, hd, KeyBegin(idx, p.sliding_window), idx, p.scale, [&](int32_t) { return q; },
            decode, nullptr, p.out + (static_cast<size_t>(row) * nh + kvh * q_per_kv) * hd);
      }
    }
    r = group_end;
  }
}

}  // namespace kvserve::cpu
