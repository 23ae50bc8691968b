// AVX2+FMA+F16C attention over int4_kc and int2_kc pages (the code bits are
// the layout's, a runtime value: one branch per 8 channels).
//
// Work unit: one query row x one kv head x a sub-group of G <= 4 of its query
// heads (as the per-token kernel in paged_attention_avx2.cc). Three passes
// over the row's keys [lo, i]:
//   1. scores, base 2 (queries carry scale * log2(e)). A quantized block's K
//      channels decode in registers with the block's per-channel scale and
//      zero (built once per block: value = fma(q, scale_d, zero_d), exactly
//      kv_layout.h's decoding), one FMA per 8 channels shared by the G heads;
//      the row's own block is read in full precision (fp32 or fp16 tail rows,
//      fp32 new rows).
//   2. softmax: max, p = 2^(s - max) (degree-5 polynomial for whole vectors
//      of 8 keys, exp2f for the rest), sum.
//   3. values: each V row decoded once per 8 channels (int4 or int2 groups
//      per token: fma(q, scale, zero)) and added to the G accumulators.
// Scores of one row live in a thread_local buffer (grown, never shrunk).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention/paged_attention_kc.h"
#include "kernels/cpu/avx2_math.h"
#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cpu::internal {

namespace {
constexpr int kMaxHeadDim = 512;
}  // namespace

bool Avx2KcAttentionSupports(const KvPageLayout& f) {
  return f.head_dim % 8 == 0 && f.head_dim <= kMaxHeadDim && f.v.elem == KvElem::kInt4 &&
         f.v.group_size % 8 == 0 && (f.tail.elem == KvElem::kFp32 || f.tail.elem == KvElem::kFp16);
}

#if !defined(__x86_64__)

void PagedAttentionKcAvx2(const PagedAttentionParams&, int32_t, int32_t) { __builtin_trap(); }

#else

namespace {

#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr float kLog2e = 1.44269504088896341f;

// Channels d0 .. d0+7 of a row of 4-bit (int4_kc) or 2-bit (int2_kc) codes.
KV_AVX2_INLINE __m256 Codes8(const uint8_t* row, int d0, int bits) {
  if (bits == 4) {
    int32_t packed;
    std::memcpy(&packed, row + d0 / 2, 4);
    const __m256i q =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(packed),
                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(0xf));
    return _mm256_cvtepi32_ps(q);
  }
  uint16_t packed;
  std::memcpy(&packed, row + d0 / 4, 2);
  const __m256i q = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(packed), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
      _mm256_set1_epi32(0x3));
  return _mm256_cvtepi32_ps(q);
}

// Channels d0 .. d0+7 of a full-precision row (fp32 or fp16).
KV_AVX2_INLINE __m256 Full8(const uint8_t* row, bool fp32, int d0) {
  if (fp32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d0);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d0)));
}

// An int4 V row's (scale, zero) of group g as two broadcasts.
KV_AVX2_INLINE void GroupAffine(const uint8_t* meta, int g, __m256* scale, __m256* zero) {
  int32_t pair;
  std::memcpy(&pair, meta + g * 4, 4);
  const __m128 sz = _mm_cvtph_ps(_mm_cvtsi32_si128(pair));  // [scale, zero, 0, 0]
  *scale = _mm256_broadcastss_ps(sz);
  *zero = _mm256_broadcastss_ps(_mm_movehdup_ps(sz));
}

struct KcJob {
  const PagedAttentionParams* p;
  const int32_t* table;
  KcSeqView s;
  int32_t lo, idx, own;
  int kvh;
  const float* q;  // [G][hd], scale * log2(e) applied
  float* out;      // [G][hd]
  float* scores;   // [G][n]
};

// Where key/value index j of the job's kv head is: a quantized block (row
// and meta) or a full-precision row.
struct KeyRef {
  const uint8_t* row;
  bool fp32;   // fp32 (else fp16) values
  bool round;  // fp32 values rounded to fp16 (new rows beside fp16 tails)
};

KV_AVX2_INLINE KeyRef FullRow(const KcJob& job, bool v, int32_t j) {
  const PagedAttentionParams& p = *job.p;
  const KvPageLayout& f = p.kv.layout;
  const bool fp32_tail = f.tail.elem == KvElem::kFp32;
  if (j < job.s.first) return {job.s.TailRow(f, v, job.kvh, j), fp32_tail, false};
  const float* r = job.s.NewRow(v ? p.new_v : p.new_k, f.num_kv_heads, f.head_dim, job.kvh, j);
  return {reinterpret_cast<const uint8_t*>(r), true, !fp32_tail};
}

// Channels d0 .. d0+7 of a full-precision key or value.
KV_AVX2_INLINE __m256 Full8(const KeyRef& k, int d0) {
  const __m256 x = Full8(k.row, k.fp32, d0);
  if (!k.round) return x;
  // As QuantizeRow stores fp16: saturated to +-65504 (NaN kept), rounded.
  const __m256 sat =
      _mm256_max_ps(_mm256_set1_ps(-kFp16Max), _mm256_min_ps(_mm256_set1_ps(kFp16Max), x));
  return _mm256_cvtph_ps(_mm256_cvtps_ph(sat, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <int G>
KV_AVX2 void AttendKc(const KcJob& job) {
  const PagedAttentionParams& p = *job.p;
  const KvPageLayout& f = p.kv.layout;
  const int hd = f.head_dim, bs = f.block_size;
  const int32_t n = job.idx - job.lo + 1;
  alignas(32) float kscale[kMaxHeadDim], kzero[kMaxHeadDim];

  // 1. Scores.
  for (int32_t j = job.lo; j <= job.idx;) {
    const int32_t kb = j / bs;
    if (kb < job.own) {
      const uint8_t* block = p.kv.Block(job.table[kb]);
      Int4ChannelAffine(block + f.BlockMetaOffset(f.k, job.kvh), hd, kscale, kzero, f.k.bits);
      const int32_t end = kb * bs + bs;
      for (; j < end; ++j) {
        const uint8_t* row = block + f.RowOffset(f.k, job.kvh, j % bs);
        __m256 a[G];
        for (int g = 0; g < G; ++g) a[g] = _mm256_setzero_ps();
        for (int d0 = 0; d0 < hd; d0 += 8) {
          const __m256 kd = _mm256_fmadd_ps(Codes8(row, d0, f.k.bits), _mm256_load_ps(kscale + d0),
                                            _mm256_load_ps(kzero + d0));
          for (int g = 0; g < G; ++g) {
            a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(job.q + g * hd + d0), kd, a[g]);
          }
        }
        for (int g = 0; g < G; ++g) job.scores[g * n + (j - job.lo)] = HSum(a[g]);
      }
    } else {
      for (; j <= job.idx; ++j) {
        const KeyRef k = FullRow(job, false, j);
        __m256 a[G];
        for (int g = 0; g < G; ++g) a[g] = _mm256_setzero_ps();
        for (int d0 = 0; d0 < hd; d0 += 8) {
          const __m256 kd = Full8(k, d0);
          for (int g = 0; g < G; ++g) {
            a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(job.q + g * hd + d0), kd, a[g]);
          }
        }
        for (int g = 0; g < G; ++g) job.scores[g * n + (j - job.lo)] = HSum(a[g]);
      }
    }
  }

  // 2. Softmax weights (unnormalised) and their sums.
  float sums[G];
  for (int g = 0; g < G; ++g) {
    float* sc = job.scores + g * n;
    float m = -INFINITY;
    int32_t i = 0;
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sc + i));
    m = HMax(vm);
    for (; i < n; ++i) m = std::max(m, sc[i]);
    const __m256 vmax = _mm256_set1_ps(m);
    __m256 vs = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
      const __m256 e = Exp2NonPositive(_mm256_sub_ps(_mm256_loadu_ps(sc + i), vmax));
      _mm256_storeu_ps(sc + i, e);
      vs = _mm256_add_ps(vs, e);
    }
    float total = HSum(vs);
    for (; i < n; ++i) {
      sc[i] = std::exp2(sc[i] - m);
      total += sc[i];
    }
    sums[g] = total;
  }

  // 3. Values.
  alignas(32) float acc[G][kMaxHeadDim];
  for (int g = 0; g < G; ++g) std::fill(acc[g], acc[g] + hd, 0.0f);
  const int vgroup = f.v.group_size;
  for (int32_t j = job.lo; j <= job.idx; ++j) {
    __m256 w[G];
    for (int g = 0; g < G; ++g) w[g] = _mm256_set1_ps(job.scores[g * n + (j - job.lo)]);
    if (j / bs < job.own) {
      const uint8_t* block = p.kv.Block(job.table[j / bs]);
      const uint8_t* row = block + f.RowOffset(f.v, job.kvh, j % bs);
      const uint8_t* meta = block + f.MetaOffset(f.v, job.kvh, j % bs);
      for (int g0 = 0; g0 < hd; g0 += vgroup) {
        __m256 scale, zero;
        GroupAffine(meta, g0 / vgroup, &scale, &zero);
        for (int d0 = g0; d0 < g0 + vgroup; d0 += 8) {
          const __m256 vd = _mm256_fmadd_ps(Codes8(row, d0, f.v.bits), scale, zero);
          for (int g = 0; g < G; ++g) {
            _mm256_store_ps(acc[g] + d0, _mm256_fmadd_ps(w[g], vd, _mm256_load_ps(acc[g] + d0)));
          }
        }
      }
    } else {
      const KeyRef v = FullRow(job, true, j);
      for (int d0 = 0; d0 < hd; d0 += 8) {
        const __m256 vd = Full8(v, d0);
        for (int g = 0; g < G; ++g) {
          _mm256_store_ps(acc[g] + d0, _mm256_fmadd_ps(w[g], vd, _mm256_load_ps(acc[g] + d0)));
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m256 inv = _mm256_set1_ps(1.0f / sums[g]);
    for (int d0 = 0; d0 < hd; d0 += 8) {
      _mm256_storeu_ps(job.out + g * hd + d0, _mm256_mul_ps(_mm256_load_ps(acc[g] + d0), inv));
    }
  }
}

}  // namespace

KV_AVX2 void PagedAttentionKcAvx2(const PagedAttentionParams& p, int32_t row_begin,
                                  int32_t row_end) {
  const KvPageLayout& f = p.kv.layout;
  const BatchView& batch = p.batch;
  const int hd = f.head_dim, bs = f.block_size, nh = p.num_heads, hkv = f.num_kv_heads;
  const int group = nh / hkv;
  const __m256 q_scale = _mm256_set1_ps(p.scale * kLog2e);
  thread_local std::vector<float> scores;
  alignas(32) float q[4 * kMaxHeadDim];
  for (int32_t r = row_begin; r < row_end; ++r) {
    KcJob job;
    job.p = &p;
    const int32_t b = batch.SeqOfRow(r);
    job.idx = batch.CacheIndex(b, r);
    job.lo = KeyBegin(job.idx, p.sliding_window);
    job.own = job.idx / bs;
    job.table = batch.BlockRow(b);
    job.s = KcViewOf(p.kv, batch, b);
    if (job.s.first > job.own * bs && job.s.tail == nullptr) {
      std::fprintf(stderr, "PagedAttention: an int4_kc or int2_kc partial block has no tail\n");
      std::abort();
    }
    const int32_t n = job.idx - job.lo + 1;
    if (scores.size() < static_cast<size_t>(4) * n) scores.resize(static_cast<size_t>(4) * n);
    job.scores = scores.data();
    job.q = q;
    for (int kvh = 0; kvh < hkv; ++kvh) {
      job.kvh = kvh;
      for (int h0 = kvh * group, end = (kvh + 1) * group; h0 < end;) {
        const int g = end - h0 >= 4 ? 4 : end - h0 >= 2 ? 2 : 1;
        const float* src = p.q + (int64_t(r) * nh + h0) * hd;
        for (int i = 0; i < g * hd; i += 8) {
          _mm256_store_ps(q + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), q_scale));
        }
        job.out = p.out + (int64_t(r) * nh + h0) * hd;
        if (g == 4) {
          AttendKc<4>(job);
        } else if (g == 2) {
          AttendKc<2>(job);
        } else {
          AttendKc<1>(job);
        }
        h0 += g;
      }
    }
  }
}

#endif  // __x86_64__

}  // namespace kvserve::cpu::internal
