// The PagedAttention dispatcher and its scalar path. The scalar path
// is the readable reference: per (row, kv head) it decodes one cached K or V
// row at a time (DequantizeRow into a head_dim scratch, never more) and serves
// every query head of the GQA group from it, with an exact two-pass softmax.
#include "kernels/cpu/attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/attention/attention_row_scalar.h"
#include "kernels/cpu/attention/paged_attention_avx2.h"
#include "kernels/cpu/attention/paged_attention_kc.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu {
namespace {

void CheckHeads(const PagedAttentionParams& p) {
  const int hkv = p.kv.layout.num_kv_heads;
  if (p.num_heads <= 0 || p.num_heads % hkv != 0) {
    std::fprintf(stderr, "PagedAttention: num_heads %d is not a multiple of num_kv_heads %d\n",
                 p.num_heads, hkv);
    std::abort();
  }
}

void PagedAttentionScalar(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end) {
  const KvPageLayout& f = p.kv.layout;
  const BatchView& batch = p.batch;
  const int hd = f.head_dim, bs = f.block_size, nh = p.num_heads;
  const int hkv = f.num_kv_heads, group = nh / hkv;
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t b = batch.SeqOfRow(r);
    const int32_t idx = batch.CacheIndex(b, r);
    const int32_t lo = KeyBegin(idx, p.sliding_window);
    const int32_t n = idx - lo + 1;
    const int32_t* table = batch.BlockRow(b);
    const int32_t sinks = p.sink_q != nullptr && p.num_sinks != nullptr ? p.num_sinks[b] : 0;
    float* mass = p.key_mass != nullptr && p.key_mass_offset[r] >= 0
                      ? p.key_mass + p.key_mass_offset[r]
                      : nullptr;
    if (mass != nullptr) std::fill(mass, mass + n, 0.0f);
    for (int kvh = 0; kvh < hkv; ++kvh) {
      const int64_t q_off = (int64_t(r) * nh + kvh * group) * hd;  // [group][hd]
      auto query = [&](int32_t i) { return (i < sinks ? p.sink_q : p.q) + q_off; };
      auto decode = [&](bool v, int32_t i, float* row) {
        const KvPartLayout& part = v ? f.v : f.k;
        const uint8_t* block = p.kv.Block(table[i / bs]);
        DequantizeRow(part, hd, block + f.RowOffset(part, kvh, i % bs),
                      block + f.MetaOffset(part, kvh, i % bs), row);
      };
      internal::AttendGroupScalar(group, hd, lo, idx, p.scale, query, decode, mass, p.out + q_off);
    }
  }
}

}  // namespace

void PagedAttention(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end) {
  if (row_begin >= row_end) return;
  CheckHeads(p);
  if (p.kv.layout.has_tails()) {
    if (ResolveCpuIsa(p.isa) == CpuIsa::kAvx2 && internal::Avx2KcAttentionSupports(p.kv.layout)) {
      internal::PagedAttentionKcAvx2(p, row_begin, row_end);
    } else {
      internal::PagedAttentionKcScalar(p, row_begin, row_end);
    }
    return;
  }
  if (ResolveCpuIsa(p.isa) == CpuIsa::kAvx2 && internal::Avx2AttentionSupports(p.kv.layout)) {
    internal::PagedAttentionAvx2(p, row_begin, row_end);
  } else {
    PagedAttentionScalar(p, row_begin, row_end);
  }
}

}  // namespace kvserve::cpu
