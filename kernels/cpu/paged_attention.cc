// fp32 reference implementation of WriteKv and PagedAttention. Other formats
// are added by the quantized-KV work; this one fixes the semantics.
#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kvserve::cpu {
namespace {

[[noreturn]] void Unsupported(KvDtype d) {
  std::fprintf(stderr, "paged attention: kv dtype %s not supported on CPU yet\n",
               std::string(KvDtypeName(d)).c_str());
  std::abort();
}

// The sequence that owns row r: the last b with query_start[b] <= r.
int32_t SeqOfRow(const BatchInput& batch, int32_t r) {
  auto it = std::upper_bound(batch.query_start.begin(), batch.query_start.end(), r);
  return static_cast<int32_t>(it - batch.query_start.begin()) - 1;
}

}  // namespace

void WriteKv(const KvWriteParams& p) {
  const KvFormat& f = *p.format;
  if (f.dtype() != KvDtype::kFp32) Unsupported(f.dtype());
  const int hkv = f.num_kv_heads(), hd = f.head_dim(), bs = f.block_size();
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    uint8_t* block = p.kv_layer + (slot / bs) * f.block_bytes();
    const int off = static_cast<int>(slot % bs);
    for (int h = 0; h < hkv; ++h) {
      std::memcpy(block + f.RowOffset(f.k(), h, off), p.k + (int64_t(t) * hkv + h) * hd,
                  hd * sizeof(float));
      std::memcpy(block + f.RowOffset(f.v(), h, off), p.v + (int64_t(t) * hkv + h) * hd,
                  hd * sizeof(float));
    }
  }
}

void PagedAttention(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end) {
  const KvFormat& f = *p.format;
  if (f.dtype() != KvDtype::kFp32) Unsupported(f.dtype());
  const BatchInput& batch = *p.batch;
  const int hd = f.head_dim(), bs = f.block_size(), nh = p.num_heads;
  const int group = nh / f.num_kv_heads();
  thread_local std::vector<float> scores;
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t b = SeqOfRow(batch, r);
    const int32_t q_len = batch.query_start[b + 1] - batch.query_start[b];
    const int32_t idx = batch.context_len[b] - q_len + (r - batch.query_start[b]);
    const int32_t lo = p.sliding_window > 0 ? std::max(0, idx - p.sliding_window + 1) : 0;
    const int32_t* table = batch.BlockRow(b);
    scores.resize(idx - lo + 1);
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / group;
      const float* q = p.q + (int64_t(r) * nh + h) * hd;
      float maxs = -INFINITY;
      for (int32_t i = lo; i <= idx; ++i) {
        const uint8_t* block = p.kv_layer + int64_t(table[i / bs]) * f.block_bytes();
        const float* k = reinterpret_cast<const float*>(block + f.RowOffset(f.k(), kvh, i % bs));
        float s = 0.0f;
        for (int d = 0; d < hd; ++d) s += q[d] * k[d];
        s *= p.scale;
        scores[i - lo] = s;
        maxs = std::max(maxs, s);
      }
      float sum = 0.0f;
      for (float& s : scores) {
        s = std::exp(s - maxs);
        sum += s;
      }
      float* out = p.out + (int64_t(r) * nh + h) * hd;
      std::fill(out, out + hd, 0.0f);
      for (int32_t i = lo; i <= idx; ++i) {
        const uint8_t* block = p.kv_layer + int64_t(table[i / bs]) * f.block_bytes();
        const float* v = reinterpret_cast<const float*>(block + f.RowOffset(f.v(), kvh, i % bs));
        const float w = scores[i - lo] / sum;
        for (int d = 0; d < hd; ++d) out[d] += w * v[d];
      }
    }
  }
}

}  // namespace kvserve::cpu
