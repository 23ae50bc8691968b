// AVX2+FMA+F16C paged attention over every KvFormat.
//
// Work unit: one query row x one kv head x a sub-group of G <= 4 of its query
// heads (a GQA group of 8 runs as two sub-groups of 4). The row's cache
// indices [lo, i] are cut into chunks of up to 8 consecutive indices inside
// one block (built once per row, shared by every kv head), and chunks into
// tiles of up to 32 chunks. Per tile:
//   1. scores. K rows are decoded in registers to "raw" values: fp16/bf16
//      widened, int8 codes, fp8 widened through fp16 (exact, value / 256),
//      int4 nibbles. Per-row scales are applied to the vector of 8 scores,
//      not to every channel: s_j = scale_j (q . raw_j), and with head_dim 8
//      int4 zeros too: + zero_j sum(q). (Larger int4 heads dequantize each
//      group in registers instead: one FMA per 8 channels, shared by the G
//      heads.) Queries carry the softmax scale times log2(e), so scores are
//      in base 2. With head_dim 8 the chunk's 8 K rows are transposed in
//      registers and 8 FMAs give one head's 8 scores; larger heads take one
//      dot product per key, two keys at a time.
//   2. online softmax: the tile max updates the running max; what earlier
//      tiles summed is rescaled by 2^(old - new); p = 2^(s - max) with a
//      degree-5 minimax polynomial (relative error ~2e-7).
//   3. values. Each V row is decoded once per 8 channels and added to the G
//      accumulators with weight p_j * scale_j (head_dim 8 int4: plus
//      sum(p_j zero_j) at the end). head_dim 8 keeps 8 / G registers per
//      head; larger heads run the tile once per block of channels with the
//      accumulators in registers (8 of them: 4 heads x 16 channels, ...,
//      1 head x 64).
// Lanes past a chunk's end score -inf and are skipped by the value loop;
// their loads repeat the chunk's last row, so nothing outside the block's
// written rows is read.
// Eviction extras (PagedAttentionParams): chunks end at the sink boundary,
// and sink chunks score with the sink query; with statistics on, step 1
// also keeps each key's base-2 score, and once the running max and sum are
// final each key's weight 2^(s - max) / sum is added to the row's key mass
// (a pass over the scores, not over the cache).
#include "kernels/cpu/attention/paged_attention_avx2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx2_math.h"

namespace kvserve::cpu::internal {

bool Avx2AttentionSupports(const KvPageLayout& f) {
  if (f.head_dim % 8 != 0 || f.head_dim > kAvx2MaxHeadDim) return false;
  for (const KvPartLayout* part : {&f.k, &f.v}) {
    if (part->elem == KvElem::kInt4 && part->group_size % 8 != 0) return false;
  }
  return true;
}

#if !defined(__x86_64__)

void PagedAttentionAvx2(const PagedAttentionParams&, int32_t, int32_t) { __builtin_trap(); }

#else

namespace {

#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr int kTileChunks = 32;
constexpr float kLog2e = 1.44269504088896341f;

// How a row's raw values become real ones.
enum class Affine { kNone, kScale, kScaleZero };

template <KvElem E>
constexpr Affine AffineOf() {
  if constexpr (E == KvElem::kInt8 || E == KvElem::kFp8E4m3) return Affine::kScale;
  if constexpr (E == KvElem::kInt4) return Affine::kScaleZero;
  return Affine::kNone;
}

// fp8 raw values are the E4M3 value / 256 (see Raw8).
template <KvElem E>
constexpr float RawUnit() {
  return E == KvElem::kFp8E4m3 ? 256.0f : 1.0f;
}

// Up to 8 consecutive cache indices inside one block.
struct Chunk {
  const uint8_t* block;
  int32_t slot;  // first slot in the block
  int32_t n;     // 1..8
};

// Where one kv head's rows of one part (K or V) live inside any block.
struct PartView {
  int64_t data_off;  // block start -> slot 0 row of this head
  int64_t meta_off;
  int32_t row_bytes;
  int32_t meta_bytes;
  int32_t group;  // int4 channels per scale group

  const uint8_t* Row(const Chunk& c) const {
    return c.block + data_off + int64_t(c.slot) * row_bytes;
  }
  const uint8_t* Meta(const Chunk& c) const {
    return c.block + meta_off + int64_t(c.slot) * meta_bytes;
  }
};

PartView PartOf(const KvPageLayout& f, const KvPartLayout& part, int kvh) {
  return PartView{f.RowOffset(part, kvh, 0), f.MetaOffset(part, kvh, 0), part.row_bytes,
                  part.meta_bytes, part.group_size};
}

struct HeadJob {
  PartView k;
  PartView v;
  int hd;
  const Chunk* chunks;
  int num_chunks;
  const float* q;  // [G][hd]: scale * log2(e) * RawUnit<K> applied
  float* out;      // [G][hd] (heads of one row are adjacent)
  // Eviction extras: the first num_sink_chunks chunks score with q_sink
  // (scaled like q); mass (when set) gets each key's weight, summed over
  // heads, one float per key of the chunks in order.
  const float* q_sink = nullptr;
  int num_sink_chunks = 0;
  float* mass = nullptr;
  int num_keys = 0;
};

// Channels d0 .. d0+7 of one row, before the row's scale and zero.
template <KvElem E>
KV_AVX2_INLINE __m256 Raw8(const uint8_t* row, int d0) {
  if constexpr (E == KvElem::kFp32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d0);
  } else if constexpr (E == KvElem::kFp16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d0)));
  } else if constexpr (E == KvElem::kBf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d0));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (E == KvElem::kInt8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d0));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  } else if constexpr (E == KvElem::kFp8E4m3) {
    // E4M3 bits shifted left by 7 are the fp16 of value / 2^8, subnormals
    // included: sign-extend to 16 bits, shift (sign lands in bit 15), clear
    // bit 14 (a copy of the sign), widen with F16C.
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d0));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7),
                                    _mm_set1_epi16(static_cast<int16_t>(0xbfff)));
    return _mm256_cvtph_ps(h);
  } else {
    static_assert(E == KvElem::kInt4);
    int32_t packed;
    std::memcpy(&packed, row + d0 / 2, 4);
    const __m256i q =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(packed),
                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(0xf));
    return _mm256_cvtepi32_ps(q);
  }
}

// int4 group (scale, zero) of one row as two broadcasts.
KV_AVX2_INLINE void Int4Group(const uint8_t* meta, int g, __m256* scale, __m256* zero) {
  int32_t pair;
  std::memcpy(&pair, meta + g * 4, 4);
  const __m128 sz = _mm_cvtph_ps(_mm_cvtsi32_si128(pair));  // [scale, zero, 0, 0]
  *scale = _mm256_broadcastss_ps(sz);
  *zero = _mm256_broadcastss_ps(_mm_movehdup_ps(sz));
}

// Lanes < n of an 8-key chunk.
KV_AVX2_INLINE __m256i HeadMask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The 4-byte meta words of a chunk's rows (rows are meta_bytes == 4 apart:
// an int8/fp8 scale, or the one int4 group of a head_dim-8 row); lanes past
// the chunk read as 0.
KV_AVX2_INLINE __m256i ChunkMetaWords(const uint8_t* meta, int n) {
  if (n == 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta));
  return _mm256_maskload_epi32(reinterpret_cast<const int*>(meta), HeadMask(n));
}

// Per-row scale (and zero) of the chunk's 8 rows as vectors over rows.
template <KvElem E>
KV_AVX2_INLINE void ChunkAffine(const uint8_t* meta, int n, __m256* scale, __m256* zero) {
  const __m256i w = ChunkMetaWords(meta, n);
  if constexpr (AffineOf<E>() == Affine::kScale) {
    *scale = _mm256_castsi256_ps(w);
  } else {
    // [scale_j, zero_j] fp16 pairs -> fp16 scales (low 128) and zeros (high).
    const __m256i lo = _mm256_and_si256(w, _mm256_set1_epi32(0xffff));
    const __m256i hi = _mm256_srli_epi32(w, 16);
    const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    *scale = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *zero = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
}

// r[j] = row j -> r[d] = channel d of rows 0..7.
KV_AVX2_INLINE void Transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Raw scores (before per-row scale) of one chunk for G heads, head_dim 8.
template <KvElem KE, int G>
KV_AVX2_INLINE void RawScoresHd8(const HeadJob& job, const Chunk& c, __m256 s[G]) {
  const uint8_t* row = job.k.Row(c);
  const int rb = job.k.row_bytes;
  __m256 r[8];
  if (c.n == 8) {
    for (int j = 0; j < 8; ++j) r[j] = Raw8<KE>(row + j * rb, 0);
  } else {
    for (int j = 0; j < 8; ++j) r[j] = Raw8<KE>(row + std::min(j, c.n - 1) * rb, 0);
  }
  Transpose8(r);
  // Two partial sums per head halve the FMA latency chain.
  for (int h = 0; h < G; ++h) {
    const float* q = job.q + h * 8;
    __m256 a = _mm256_mul_ps(r[0], _mm256_broadcast_ss(q));
    __m256 b = _mm256_mul_ps(r[1], _mm256_broadcast_ss(q + 1));
    for (int d = 2; d < 8; d += 2) {
      a = _mm256_fmadd_ps(r[d], _mm256_broadcast_ss(q + d), a);
      b = _mm256_fmadd_ps(r[d + 1], _mm256_broadcast_ss(q + d + 1), b);
    }
    s[h] = _mm256_add_ps(a, b);
  }
}

// Scores of one chunk for G heads, any head_dim multiple of 8; int4 rows are
// dequantized per group in registers, other formats leave the row scale to
// the caller.
// Dot products of one K row with G query heads, accumulated in 2 G
// independent chains (keys are done in pairs, so 4 G chains are in flight).
template <KvElem KE, int G>
KV_AVX2_INLINE void RowDots(const HeadJob& job, const uint8_t* row, const uint8_t* meta,
                            __m256 a[G]) {
  if constexpr (KE == KvElem::kInt4) {
    const int group = job.k.group;
    for (int g0 = 0; g0 < job.hd; g0 += group) {
      __m256 scale, zero;
      Int4Group(meta, g0 / group, &scale, &zero);
      for (int d0 = g0; d0 < g0 + group; d0 += 8) {
        const __m256 kd = _mm256_fmadd_ps(Raw8<KE>(row, d0), scale, zero);
        for (int h = 0; h < G; ++h) {
          a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(job.q + h * job.hd + d0), kd, a[h]);
        }
      }
    }
  } else {
    for (int d0 = 0; d0 < job.hd; d0 += 8) {
      const __m256 kd = Raw8<KE>(row, d0);
      for (int h = 0; h < G; ++h) {
        a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(job.q + h * job.hd + d0), kd, a[h]);
      }
    }
  }
}

// Scores of one chunk for G heads, any head_dim multiple of 8; int4 rows are
// dequantized per group in registers, other formats leave the row scale to
// the caller. Two keys at a time, so their FMA chains overlap.
template <KvElem KE, int G>
KV_AVX2_INLINE void RawScores(const HeadJob& job, const Chunk& c, __m256 s[G]) {
  const uint8_t* row = job.k.Row(c);
  const uint8_t* meta = job.k.Meta(c);
  const int rb = job.k.row_bytes, mb = job.k.meta_bytes;
  alignas(32) float t[G][8] = {};
  int j = 0;
  for (; j + 2 <= c.n; j += 2) {
    __m256 a0[G], a1[G];
    for (int h = 0; h < G; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
    RowDots<KE, G>(job, row + j * rb, meta + j * mb, a0);
    RowDots<KE, G>(job, row + (j + 1) * rb, meta + (j + 1) * mb, a1);
    for (int h = 0; h < G; ++h) {
      t[h][j] = HSum(a0[h]);
      t[h][j + 1] = HSum(a1[h]);
    }
  }
  if (j < c.n) {
    __m256 a0[G];
    for (int h = 0; h < G; ++h) a0[h] = _mm256_setzero_ps();
    RowDots<KE, G>(job, row + j * rb, meta + j * mb, a0);
    for (int h = 0; h < G; ++h) t[h][j] = HSum(a0[h]);
  }
  for (int h = 0; h < G; ++h) s[h] = _mm256_load_ps(t[h]);
}

// Adds the tile's weighted V rows for channels [d0, d0 + 8 D) into acc,
// keeping the 8 D G partial sums in registers over the whole tile.
template <KvElem VE, int G, int D>
KV_AVX2_INLINE void ValuesBlock(const HeadJob& job, const Chunk* chunks, int nc,
                                const float (*w)[kTileChunks * 8], int d0, float* acc,
                                int acc_stride) {
  __m256 a[G][D];
  for (int h = 0; h < G; ++h) {
    for (int dd = 0; dd < D; ++dd) a[h][dd] = _mm256_setzero_ps();
  }
  const PartView& v = job.v;
  for (int ci = 0; ci < nc; ++ci) {
    const Chunk& c = chunks[ci];
    const uint8_t* row = v.Row(c);
    const uint8_t* meta = v.Meta(c);
    for (int j = 0; j < c.n; ++j) {
      const uint8_t* rj = row + j * v.row_bytes;
      __m256 wj[G];
      for (int h = 0; h < G; ++h) wj[h] = _mm256_broadcast_ss(w[h] + ci * 8 + j);
      for (int dd = 0; dd < D; ++dd) {
        const int d = d0 + 8 * dd;
        __m256 vd = Raw8<VE>(rj, d);
        if constexpr (VE == KvElem::kInt4) {
          __m256 scale, zero;
          Int4Group(meta + j * v.meta_bytes, d / v.group, &scale, &zero);
          vd = _mm256_fmadd_ps(vd, scale, zero);
        }
        for (int h = 0; h < G; ++h) a[h][dd] = _mm256_fmadd_ps(wj[h], vd, a[h][dd]);
      }
    }
  }
  for (int h = 0; h < G; ++h) {
    for (int dd = 0; dd < D; ++dd) {
      float* dst = acc + h * acc_stride + d0 + 8 * dd;
      _mm256_store_ps(dst, _mm256_add_ps(_mm256_load_ps(dst), a[h][dd]));
    }
  }
}

template <KvElem KE, KvElem VE, int G, bool kHd8>
KV_AVX2 void AttendHeads(const HeadJob& job) {
  const int hd = kHd8 ? 8 : job.hd;
  constexpr Affine kK = AffineOf<KE>(), kV = AffineOf<VE>();
  // In the head_dim-8 kernel int4 rows keep their zero outside the dot
  // products; the general kernel dequantizes int4 groups in registers.
  constexpr bool kKZero = kHd8 && kK == Affine::kScaleZero;
  constexpr bool kVZero = kHd8 && kV == Affine::kScaleZero;
  constexpr bool kKScale = kK == Affine::kScale || kKZero;
  constexpr bool kVScale = kV == Affine::kScale || kVZero;

  alignas(32) float p[G][kTileChunks * 8];
  alignas(32) float acc_mem[kHd8 ? 1 : G][kHd8 ? 8 : kAvx2MaxHeadDim];
  __m256 acc8[G], zacc[G];
  float m[G], l[G], qsum[G] = {}, qsum_sink[G] = {};
  HeadJob sink_job = job;  // scores sink chunks
  sink_job.q = job.q_sink;
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
    acc8[h] = _mm256_setzero_ps();
    zacc[h] = _mm256_setzero_ps();
    if constexpr (!kHd8) std::fill(acc_mem[h], acc_mem[h] + hd, 0.0f);
    if constexpr (kKZero) {
      qsum[h] = HSum(_mm256_loadu_ps(job.q + h * 8));
      if (job.num_sink_chunks > 0) qsum_sink[h] = HSum(_mm256_loadu_ps(job.q_sink + h * 8));
    }
  }
  // With statistics: every key's base-2 score per head, [G][num_keys].
  thread_local std::vector<float> raw;
  if (job.mass != nullptr) raw.resize(static_cast<size_t>(G) * job.num_keys);
  int key_off = 0;
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  for (int c0 = 0; c0 < job.num_chunks; c0 += kTileChunks) {
    const int nc = std::min(kTileChunks, job.num_chunks - c0);
    const Chunk* chunks = job.chunks + c0;

    // 1. Scores (base 2) and the tile max.
    __m256 vmax[G];
    for (int h = 0; h < G; ++h) vmax[h] = neg_inf;
    for (int ci = 0; ci < nc; ++ci) {
      const Chunk& c = chunks[ci];
      const bool sink = c0 + ci < job.num_sink_chunks;
      const HeadJob& qjob = sink ? sink_job : job;
      __m256 s[G];
      if constexpr (kHd8) {
        RawScoresHd8<KE, G>(qjob, c, s);
      } else {
        RawScores<KE, G>(qjob, c, s);
      }
      if constexpr (kKScale) {
        __m256 scale, zero;
        ChunkAffine<KE>(job.k.Meta(c), c.n, &scale, &zero);
        for (int h = 0; h < G; ++h) {
          if constexpr (kKZero) {
            const float qs = sink ? qsum_sink[h] : qsum[h];
            s[h] = _mm256_fmadd_ps(s[h], scale, _mm256_mul_ps(zero, _mm256_set1_ps(qs)));
          } else {
            s[h] = _mm256_mul_ps(s[h], scale);
          }
        }
      }
      if (c.n < 8) {
        const __m256 live = _mm256_castsi256_ps(HeadMask(c.n));
        for (int h = 0; h < G; ++h) s[h] = _mm256_blendv_ps(neg_inf, s[h], live);
      }
      for (int h = 0; h < G; ++h) {
        _mm256_store_ps(p[h] + ci * 8, s[h]);
        vmax[h] = _mm256_max_ps(vmax[h], s[h]);
      }
      if (job.mass != nullptr) {
        for (int h = 0; h < G; ++h) {
          std::copy_n(p[h] + ci * 8, c.n,
                      raw.data() + static_cast<size_t>(h) * job.num_keys + key_off);
        }
        key_off += c.n;
      }
    }

    // 2. Online softmax: rescale what earlier tiles accumulated.
    for (int h = 0; h < G; ++h) {
      const float m_new = std::max(m[h], HMax(vmax[h]));
      if (m_new > m[h] && l[h] > 0.0f) {
        const float alpha = std::exp2(m[h] - m_new);
        l[h] *= alpha;
        const __m256 va = _mm256_set1_ps(alpha);
        if constexpr (kHd8) {
          acc8[h] = _mm256_mul_ps(acc8[h], va);
          zacc[h] = _mm256_mul_ps(zacc[h], va);
        } else {
          for (int d0 = 0; d0 < hd; d0 += 8) {
            _mm256_store_ps(acc_mem[h] + d0, _mm256_mul_ps(_mm256_load_ps(acc_mem[h] + d0), va));
          }
        }
      }
      m[h] = m_new;
      const __m256 vm = _mm256_set1_ps(m_new);
      __m256 lsum = _mm256_setzero_ps();
      for (int ci = 0; ci < nc; ++ci) {
        const __m256 e = Exp2NonPositive(_mm256_sub_ps(_mm256_load_ps(p[h] + ci * 8), vm));
        _mm256_store_ps(p[h] + ci * 8, e);
        lsum = _mm256_add_ps(lsum, e);
      }
      l[h] += HSum(lsum);
    }

    // 3. Values: fold per-row scales into the weights, then accumulate.
    if constexpr (kVScale) {
      for (int ci = 0; ci < nc; ++ci) {
        __m256 scale, zero;
        ChunkAffine<VE>(job.v.Meta(chunks[ci]), chunks[ci].n, &scale, &zero);
        for (int h = 0; h < G; ++h) {
          const __m256 e = _mm256_load_ps(p[h] + ci * 8);
          if constexpr (kVZero) zacc[h] = _mm256_fmadd_ps(e, zero, zacc[h]);
          _mm256_store_ps(p[h] + ci * 8, _mm256_mul_ps(e, scale));
        }
      }
    }
    if constexpr (kHd8) {
      // kA accumulators per head (keys j mod kA), so FMAs do not wait on
      // each other; 8 registers in all.
      constexpr int kA = 8 / G;
      __m256 a[G][kA];
      for (int h = 0; h < G; ++h) {
        for (int k = 0; k < kA; ++k) a[h][k] = _mm256_setzero_ps();
      }
      const int rb = job.v.row_bytes;
      for (int ci = 0; ci < nc; ++ci) {
        const Chunk& c = chunks[ci];
        const uint8_t* row = job.v.Row(c);
        const float* w = p[0] + ci * 8;
        if (c.n == 8) {
          for (int j = 0; j < 8; ++j) {
            const __m256 vd = Raw8<VE>(row + j * rb, 0);
            for (int h = 0; h < G; ++h) {
              a[h][j % kA] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + h * kTileChunks * 8 + j), vd,
                                             a[h][j % kA]);
            }
          }
        } else {
          for (int j = 0; j < c.n; ++j) {
            const __m256 vd = Raw8<VE>(row + j * rb, 0);
            for (int h = 0; h < G; ++h) {
              a[h][0] =
                  _mm256_fmadd_ps(_mm256_broadcast_ss(w + h * kTileChunks * 8 + j), vd, a[h][0]);
            }
          }
        }
      }
      for (int h = 0; h < G; ++h) {
        for (int k = 0; k < kA; ++k) acc8[h] = _mm256_add_ps(acc8[h], a[h][k]);
      }
    } else {
      constexpr int D = 8 / G;
      int d0 = 0;
      for (; d0 + 8 * D <= hd; d0 += 8 * D) {
        ValuesBlock<VE, G, D>(job, chunks, nc, p, d0, acc_mem[0], kAvx2MaxHeadDim);
      }
      for (; d0 < hd; d0 += 8)
        ValuesBlock<VE, G, 1>(job, chunks, nc, p, d0, acc_mem[0], kAvx2MaxHeadDim);
    }
  }

  if (job.mass != nullptr) {
    for (int h = 0; h < G; ++h) {
      const float* sh = raw.data() + static_cast<size_t>(h) * job.num_keys;
      const float inv = 1.0f / l[h];
      for (int k = 0; k < job.num_keys; ++k) job.mass[k] += std::exp2(sh[k] - m[h]) * inv;
    }
  }
  for (int h = 0; h < G; ++h) {
    const __m256 inv = _mm256_set1_ps(RawUnit<VE>() / l[h]);
    float* out = job.out + h * hd;
    if constexpr (kHd8) {
      __m256 o = _mm256_mul_ps(acc8[h], inv);
      if constexpr (kVZero) o = _mm256_add_ps(o, _mm256_set1_ps(HSum(zacc[h]) / l[h]));
      _mm256_storeu_ps(out, o);
    } else {
      for (int d0 = 0; d0 < hd; d0 += 8) {
        _mm256_storeu_ps(out + d0, _mm256_mul_ps(_mm256_load_ps(acc_mem[h] + d0), inv));
      }
    }
  }
}

using AttendFn = void (*)(const HeadJob&);

template <KvElem KE, KvElem VE>
AttendFn PickForElems(int g, bool hd8) {
  switch (g) {
    case 4:
      return hd8 ? AttendHeads<KE, VE, 4, true> : AttendHeads<KE, VE, 4, false>;
    case 2:
      return hd8 ? AttendHeads<KE, VE, 2, true> : AttendHeads<KE, VE, 2, false>;
    default:
      return hd8 ? AttendHeads<KE, VE, 1, true> : AttendHeads<KE, VE, 1, false>;
  }
}

// The (K, V) element pairs KvFormat makes: both parts alike, or K int8 with
// V int4 (k8v4).
AttendFn Pick(KvElem ke, KvElem ve, int g, bool hd8) {
  if (ke == KvElem::kInt8 && ve == KvElem::kInt4) {
    return PickForElems<KvElem::kInt8, KvElem::kInt4>(g, hd8);
  }
  if (ke != ve) __builtin_trap();
  switch (ke) {
    case KvElem::kFp32:
      return PickForElems<KvElem::kFp32, KvElem::kFp32>(g, hd8);
    case KvElem::kFp16:
      return PickForElems<KvElem::kFp16, KvElem::kFp16>(g, hd8);
    case KvElem::kBf16:
      return PickForElems<KvElem::kBf16, KvElem::kBf16>(g, hd8);
    case KvElem::kFp8E4m3:
      return PickForElems<KvElem::kFp8E4m3, KvElem::kFp8E4m3>(g, hd8);
    case KvElem::kInt8:
      return PickForElems<KvElem::kInt8, KvElem::kInt8>(g, hd8);
    case KvElem::kInt4:
      return PickForElems<KvElem::kInt4, KvElem::kInt4>(g, hd8);
    case KvElem::kInt4Channel:  // int4_kc: paged_attention_kc_avx2.cc
      break;
  }
  __builtin_trap();
}

// Walks blocks forward from lo's block, so there is one division per row.
// No chunk straddles cache index `split` (the sinks' end).
void BuildChunks(const uint8_t* layer, int64_t block_bytes, int bs, const int32_t* table,
                 int32_t lo, int32_t idx, int32_t split, std::vector<Chunk>* chunks) {
  chunks->clear();
  int32_t blk = lo / bs, slot = lo % bs;
  for (int32_t i = lo; i <= idx;) {
    int32_t n = std::min({8, bs - slot, idx + 1 - i});
    if (i < split) n = std::min(n, split - i);
    chunks->push_back(Chunk{layer + int64_t(table[blk]) * block_bytes, slot, n});
    i += n;
    slot += n;
    if (slot == bs) {
      slot = 0;
      ++blk;
    }
  }
}

}  // namespace

KV_AVX2 void PagedAttentionAvx2(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end) {
  const KvPageLayout& f = p.kv.layout;
  const BatchView& batch = p.batch;
  const int hd = f.head_dim, nh = p.num_heads, hkv = f.num_kv_heads;
  const int group = nh / hkv;
  const bool hd8 = hd == 8;
  const AttendFn fn4 = Pick(f.k.elem, f.v.elem, 4, hd8), fn2 = Pick(f.k.elem, f.v.elem, 2, hd8),
                 fn1 = Pick(f.k.elem, f.v.elem, 1, hd8);
  // Softmax in base 2; fp8 K rows decode to value / 256 (see Raw8).
  const float k_unit = f.k.elem == KvElem::kFp8E4m3 ? 256.0f : 1.0f;
  const __m256 q_scale = _mm256_set1_ps(p.scale * kLog2e * k_unit);
  thread_local std::vector<Chunk> chunks;
  alignas(32) float q[4 * kAvx2MaxHeadDim];
  alignas(32) float q_sink[4 * kAvx2MaxHeadDim];
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t b = batch.SeqOfRow(r);
    const int32_t idx = batch.CacheIndex(b, r);
    const int32_t lo = KeyBegin(idx, p.sliding_window);
    const int32_t sinks = p.sink_q != nullptr && p.num_sinks != nullptr ? p.num_sinks[b] : 0;
    BuildChunks(p.kv.pages, f.block_bytes, f.block_size, batch.BlockRow(b), lo, idx, sinks,
                &chunks);
    HeadJob job;
    job.hd = hd;
    job.chunks = chunks.data();
    job.num_chunks = static_cast<int>(chunks.size());
    job.q = q;
    job.q_sink = q_sink;
    for (int32_t i = lo; job.num_sink_chunks < job.num_chunks && i < sinks;) {
      i += chunks[job.num_sink_chunks++].n;
    }
    job.num_keys = idx - lo + 1;
    if (p.key_mass != nullptr && p.key_mass_offset[r] >= 0) {
      job.mass = p.key_mass + p.key_mass_offset[r];
      std::fill(job.mass, job.mass + job.num_keys, 0.0f);
    }
    for (int kvh = 0; kvh < hkv; ++kvh) {
      job.k = PartOf(f, f.k, kvh);
      job.v = PartOf(f, f.v, kvh);
      for (int h0 = kvh * group, end = (kvh + 1) * group; h0 < end;) {
        const int g = end - h0 >= 4 ? 4 : end - h0 >= 2 ? 2 : 1;
        const float* src = p.q + (int64_t(r) * nh + h0) * hd;
        for (int i = 0; i < g * hd; i += 8) {
          _mm256_store_ps(q + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), q_scale));
        }
        if (job.num_sink_chunks > 0) {
          const float* ssrc = p.sink_q + (int64_t(r) * nh + h0) * hd;
          for (int i = 0; i < g * hd; i += 8) {
            _mm256_store_ps(q_sink + i, _mm256_mul_ps(_mm256_loadu_ps(ssrc + i), q_scale));
          }
        }
        job.out = p.out + (int64_t(r) * nh + h0) * hd;
        (g == 4 ? fn4 : g == 2 ? fn2 : fn1)(job);
        h0 += g;
      }
    }
  }
}

#endif  // __x86_64__

}  // namespace kvserve::cpu::internal
