// Device code of the fast paged attention kernel (model.attention_kernel:
// fast): the work items, launch grid, arguments, workspace and merge kernel
// of paged_attention_kernel.cuh, with the K/V pages brought in by cp.async
// through a three-stage shared-memory ring and both products on tensor
// cores (mma.sync m16n8k16, kernels/cuda/device/mma.cuh).
//
// CTA (x, y): work item x, query heads [y * hpc, (y + 1) * hpc) of one kv
// head; its nq = rows * hpc <= 16 query vectors are the 16 rows of the mma
// A tile (rows past nq are zeros and masked). Per tile of kMmaKeys = 64 keys
// of [key_begin, key_end):
//   1. the tile's K and V rows (and scales) were issued as 16-byte cp.async
//      copies two tiles ahead (keys past key_end are zero-filled, never
//      read); one wait and a barrier make this tile's stage visible;
//   2. quantized formats (fp8, int8, int4, k8v4): every thread decodes a
//      share of the stage's V rows into an fp16 V tile (DecodeChunk: packed
//      half math, within one fp16 rounding of the reference decoders of
//      kv_decode.cuh); K stays encoded in the stage and step 3 decodes each
//      code in registers where it loads it (KRows), so K needs no fp16 tile,
//      no shared-memory round trip and no barrier; fp16 and bf16 pages are
//      used in place;
//   3. warp w takes keys [16w, 16w + 16) of the tile: S = Q K^T as 2 n-tiles
//      x head_dim / 16 k-steps of mma, with Q and K read as 16-byte shared
//      loads (the reduction's channel order is permuted the same way on both
//      sides: lane t of k-steps 2G, 2G + 1 holds channels 32G + 8t .. + 7,
//      so one load fills both steps' fragments);
//   4. scale, causal / window / tile masks, and the warp's online softmax on
//      the accumulator fragments (row max over the 4 lanes of a quad by two
//      shuffles; each lane keeps a partial row sum);
//   5. the softmax weights, rounded to the compute type, become the A tile
//      of O += P V without leaving registers (the C layout of two n-tiles is
//      the A layout of one k-step); V's B fragments come from ldmatrix.trans.
// Then the four warps' (max, sum, O) are merged through shared memory and
// written as the reference kernel writes them (out, or a partition's slot,
// and softmax_stats).
//
// Shared memory rows are XOR-swizzled by 16-byte chunk so that the loads of
// a quarter warp (K and Q: chunk ^ 4 (row & 1)) and ldmatrix's eight rows
// (V: chunk ^ (row & 7)) fall in distinct banks.
//
// Numerics: the compute type is bf16 for bf16 pages and fp16 otherwise; q is
// rounded to it, K and V of quantized pages are the reference decoders'
// floats rounded to fp16, P is rounded to the compute type; products are
// exact and sums fp32 (tensor-core accumulation order is the device's);
// scores are scaled by scale * log2(e) and exponentiated with exp2f (one
// ex2 instruction, 2 ulp) where the reference kernel calls expf. The
// accumulators are rescaled only when a row's running max moves.
// Sinks: the warps whose keys include sink keys also score them with the
// sink query (a second Q tile) and keep those columns.
//
// Takes head_dim 64, 128 and 256 and power-of-two block sizes; fp32 and
// int4_kc pages and other shapes use the reference kernel (the launcher
// decides, MmaAttentionSupports).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention/paged_attention_kernel.cuh"
#include "kernels/cuda/device/mma.cuh"

namespace kvserve::cuda::attention_detail {

inline constexpr int kMmaKeys = 64;  // keys per tile: 16 per warp
inline constexpr int kMmaStages = 3;
static_assert(kThreads == 128 && kMaxQ == 16, "the mma tiles assume 4 warps and 16 query rows");

__host__ __device__ constexpr bool IsHalfElem(KvElem e) {
  return e == KvElem::kFp16 || e == KvElem::kBf16;
}

__host__ __device__ inline bool IsPow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

// log2 of a power of two (one instruction on the device).
__host__ __device__ inline int Log2Pow2(int x) {
#if defined(__CUDA_ARCH__)
  return __ffs(x) - 1;
#else
  return __builtin_ctz(static_cast<unsigned>(x));
#endif
}

// Whether the fast kernel takes this layout (else the reference kernel).
__host__ __device__ inline bool MmaAttentionSupports(const KvPageLayout& l) {
  const auto ok = [](KvElem e) {
    return e == KvElem::kFp16 || e == KvElem::kBf16 || e == KvElem::kFp8E4m3 ||
           e == KvElem::kInt8 || e == KvElem::kInt4;
  };
  const bool pair_ok =
      l.k.elem == l.v.elem || (l.k.elem == KvElem::kInt8 && l.v.elem == KvElem::kInt4);
  // int4 decodes 8 channels with one (scale, zero): groups of a multiple of
  // 8, and a power of two, so a chunk's group and a key's scale words are
  // found by shifts (an integer division is some 20 instructions).
  // fp8 and int8 keep one 4-byte scale per token and head.
  const auto group_ok = [](const KvPartLayout& p) {
    if (p.elem == KvElem::kFp8E4m3 || p.elem == KvElem::kInt8) return p.meta_bytes == 4;
    return p.elem != KvElem::kInt4 || (p.group_size % 8 == 0 && IsPow2(p.group_size));
  };
  return ok(l.k.elem) && ok(l.v.elem) && pair_ok && group_ok(l.k) && group_ok(l.v) &&
         (l.head_dim == 64 || l.head_dim == 128 || l.head_dim == 256) && IsPow2(l.block_size);
}

// Shared memory of one CTA, in bytes; the same arithmetic on both sides.
// Offsets of at most a few hundred KB: 32-bit (shared addresses are).
struct MmaSmem {
  int32_t q = 0;       // Q tile [16][head_dim] of the compute type
  int32_t sink_q = 0;  // the sink query's tile, when the step has sinks
  int32_t ring = 0;    // start of the stages
  int32_t stage = 0;   // bytes of one stage: K rows, V rows, K meta, V meta
  int32_t k_rows = 0, v_rows = 0, k_meta = 0, v_meta = 0;  // offsets inside a stage
  int32_t v16 = 0;    // the decoded fp16 V tile (quantized V), or -1; K is decoded in registers
  int32_t merge = 0;  // the warps' (max, sum, O), reusing the ring
  int32_t total = 0;
};

__host__ __device__ inline MmaSmem MmaSmemLayout(const KvPageLayout& l, bool sinks) {
  MmaSmem s;
  const int32_t hd = l.head_dim;
  const int32_t tile = 16 * hd * 2;
  s.q = 0;
  s.sink_q = sinks ? tile : -1;
  s.ring = tile * (sinks ? 2 : 1);
  s.k_rows = 0;
  s.v_rows = s.k_rows + int32_t(kMmaKeys) * l.k.row_bytes;
  s.k_meta = s.v_rows + int32_t(kMmaKeys) * l.v.row_bytes;
  s.v_meta = s.k_meta + ((int32_t(kMmaKeys) * l.k.meta_bytes + 15) & ~int32_t{15});
  s.stage = s.v_meta + ((int32_t(kMmaKeys) * l.v.meta_bytes + 15) & ~int32_t{15});
  int32_t end = s.ring + kMmaStages * s.stage;
  const int32_t half_tile = int32_t(kMmaKeys) * hd * 2;
  s.v16 = IsHalfElem(l.v.elem) ? -1 : end;
  if (s.v16 >= 0) end += half_tile;
  s.merge = s.ring;
  const int32_t merge_end = s.merge + kWarps * 16 * (hd + 2) * 4;
  s.total = end > merge_end ? end : merge_end;
  return s;
}

// 16-byte chunk swizzles (see the file comment); rows have >= 8 chunks.
__device__ __forceinline__ int KSwz(int row, int chunk) { return chunk ^ ((row & 1) << 2); }
__device__ __forceinline__ int VSwz(int row, int chunk) { return chunk ^ (row & 7); }

// Quantized K rows stay encoded in the stage and Scores decodes them in
// registers: a lane reads the W-byte codes of channels 8c .. 8c + 7 (W = 8
// for int8 and fp8, 4 for int4) of rows kw0 + 8 nt + g, c = 4G + t. The
// 16-byte chunk of those codes is XORed per row so that the rows one load
// instruction touches (4 per half-warp of 8-byte loads, 8 per warp of
// 4-byte loads) fall on distinct banks: rows that share a 128-byte bank
// cycle differ in where they start; the others take XOR masks apart.
template <KvElem E, int kHd>
__device__ __forceinline__ int KRawSwz(int row, int chunk) {
  constexpr int kRow = E == KvElem::kInt4 ? kHd / 2 : kHd;  // bytes
  constexpr int kChunks = kRow / 16;
  constexpr int kPerCycle = kRow >= 128 ? 1 : 128 / kRow;  // rows per 128 bytes
  constexpr int kShift = kPerCycle == 1 ? 0 : kPerCycle == 2 ? 1 : kPerCycle == 4 ? 2 : 3;
  if constexpr (E == KvElem::kInt4) {
    // One chunk a row per load: 8 rows over the 8 slots.
    constexpr int kMask = (kChunks < 8 ? kChunks : 8) - 1;
    return chunk ^ ((row >> kShift) & kMask);
  } else {
    // A pair of chunks {2G, 2G + 1} a row per load: 4 rows over 4 pairs.
    constexpr int kMask = (kChunks / 2 < 4 ? kChunks / 2 : 4) - 1;
    return chunk ^ (((row >> kShift) & kMask) << 1);
  }
}

// Two floats as a packed pair of the compute type (low half = lo).
template <bool kBf16>
__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  uint32_t u;
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&u, &h, 4);
  }
  return u;
}

template <bool kBf16>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kBf16) {
    mma::MmaBf16(d, a, b);
  } else {
    mma::MmaF16(d, a, b);
  }
}

// Bytes of one token's row of head_dim kHd values of element E.
template <KvElem E, int kHd>
__host__ __device__ constexpr int RowBytes() {
  return E == KvElem::kInt4 ? kHd / 2 : E == KvElem::kFp8E4m3 || E == KvElem::kInt8 ? kHd : 2 * kHd;
}

// Cost-check markers (tests/kernels/cuda/attention/attention_cost_check.sh): PTX
// comments around the tile loop's body and the rare sink branch, only in
// the check's compile.
#if defined(KVSERVE_COST_MARKERS) && defined(__CUDA_ARCH__)
#define KV_COST_MARK(name) asm volatile("// KV_COST " name ";")
#else
#define KV_COST_MARK(name)
#endif

// Where one kv head's rows start inside any block, per part (host-computed
// layout offsets, resolved once per CTA).
struct HeadOffsets {
  int64_t k, v, k_meta, v_meta;
};

// Issues the cp.async copies of one tile: the K and V rows (and scales) of
// its n valid keys, 16-byte chunks (4-byte words for scales), keys past n
// zero-filled and never read. Rows used in place are swizzled (K: KSwz, V:
// VSwz), and so are quantized K rows, which Scores decodes from the stage
// (KRawSwz). Thread tid keeps chunk tid % chunks of rows tid / chunks + 8k, so
// one block-table entry and one block address serve its K and V chunks of
// a key.
template <KvElem KE, KvElem VE, int kHd>
__device__ __forceinline__ void IssueTile(const KernelArgs& a, const HeadOffsets& off,
                                          uint8_t* stage, const MmaSmem& sl, int32_t t0, int n,
                                          const int32_t* table, int lbs) {
  constexpr int kKRow = RowBytes<KE, kHd>(), kVRow = RowBytes<VE, kHd>();
  constexpr int kKChunks = kKRow / 16, kVChunks = kVRow / 16;
  static_assert((kKChunks & (kKChunks - 1)) == 0 && kMmaKeys * kVChunks % kThreads == 0);
  const int tid = static_cast<int>(threadIdx.x);
  const int bs_mask = a.kv.layout.block_size - 1;
  const int64_t block_bytes = a.kv.layout.block_bytes;
  const auto block_of = [&](int j) {
    return a.kv.pages + int64_t(table[(t0 + j) >> lbs]) * block_bytes;
  };
  const auto copy_rows = [&](auto chunks_tag, int64_t part_off, int row_bytes, uint8_t* dst,
                             auto swizzle, bool with_v, int64_t v_off, uint8_t* v_dst) {
    constexpr int kChunks = decltype(chunks_tag)::value;
    const int c = tid % kChunks;
    // At head_dim 256 (16 rows a thread) a full unroll spills.
    [[maybe_unused]] constexpr int kUnrollRows = kHd >= 256 ? 4 : kMmaKeys * kChunks / kThreads;
#pragma unroll kUnrollRows
    for (int k = 0; k < kMmaKeys * kChunks / kThreads; ++k) {
      const int j = tid / kChunks + k * (kThreads / kChunks);
      const bool valid = j < n;
      const uint8_t* blk = valid ? block_of(j) : a.kv.pages;
      const int slot = valid ? (t0 + j) & bs_mask : 0;
      const int64_t row = int64_t(slot) * row_bytes + 16 * c;
      mma::CpAsync16(dst + j * row_bytes + 16 * swizzle.k(j, c), valid ? blk + part_off + row : blk,
                     valid ? 16 : 0);
      if (with_v) {
        mma::CpAsync16(v_dst + j * row_bytes + 16 * swizzle.v(j, c),
                       valid ? blk + v_off + row : blk, valid ? 16 : 0);
      }
    }
  };
  struct KOnly {
    __device__ int k(int j, int c) const {
      if constexpr (IsHalfElem(KE)) {
        return KSwz(j, c);
      } else {
        return KRawSwz<KE, kHd>(j, c);
      }
    }
    __device__ int v(int j, int c) const { return IsHalfElem(VE) ? VSwz(j, c) : c; }
  };
  struct VOnly {
    __device__ int k(int j, int c) const { return IsHalfElem(VE) ? VSwz(j, c) : c; }
    __device__ int v(int, int c) const { return c; }
  };
  if constexpr (kKRow == kVRow) {
    copy_rows(std::integral_constant<int, kKChunks>{}, off.k, kKRow, stage + sl.k_rows, KOnly{},
              true, off.v, stage + sl.v_rows);
  } else {
    copy_rows(std::integral_constant<int, kKChunks>{}, off.k, kKRow, stage + sl.k_rows, KOnly{},
              false, 0, nullptr);
    copy_rows(std::integral_constant<int, kVChunks>{}, off.v, kVRow, stage + sl.v_rows, VOnly{},
              false, 0, nullptr);
  }
  // Scales: one 4-byte word per key for fp8 and int8 (known here), and
  // meta_bytes / 4 = head_dim / group_size for int4, a power of two
  // (MmaAttentionSupports): the key and word of element e by shifts.
  const auto copy_meta = [&](auto elem_tag, const KvPartLayout& part, int64_t meta_off,
                             uint8_t* dst) {
    constexpr bool kOneWord = decltype(elem_tag)::value != KvElem::kInt4;
    const int lw = kOneWord ? 0 : Log2Pow2(part.meta_bytes / 4);
    for (int e = tid; e < (kMmaKeys << lw); e += kThreads) {
      const int j = e >> lw, w = e & ((1 << lw) - 1);
      const bool valid = j < n;
      const uint8_t* blk = valid ? block_of(j) : a.kv.pages;
      const int slot = valid ? (t0 + j) & bs_mask : 0;
      mma::CpAsync4(dst + j * part.meta_bytes + 4 * w,
                    valid ? blk + meta_off + int64_t(slot) * part.meta_bytes + 4 * w : blk,
                    valid ? 4 : 0);
    }
  };
  if constexpr (!IsHalfElem(KE)) {
    copy_meta(std::integral_constant<KvElem, KE>{}, a.kv.layout.k, off.k_meta, stage + sl.k_meta);
  }
  if constexpr (!IsHalfElem(VE)) {
    copy_meta(std::integral_constant<KvElem, VE>{}, a.kv.layout.v, off.v_meta, stage + sl.v_meta);
  }
}

// __byte_perm (byte i of the result is byte (s >> 4i) & 7 of {y, x}).
__device__ __forceinline__ uint32_t BytePerm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t{y} << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// __hfma2 (one rounding); on the host exactly so, through double (a product
// of two halves plus a half is exact there).
__device__ __forceinline__ __half2 Hfma2(__half2 a, __half2 b, __half2 c) {
#if defined(__CUDA_ARCH__)
  return __hfma2(a, b, c);
#else
  const float2 fa = __half22float2(a), fb = __half22float2(b), fc = __half22float2(c);
  return __halves2half2(__double2half(double(fa.x) * fb.x + fc.x),
                        __double2half(double(fa.y) * fb.y + fc.y));
#endif
}

// Bit casts (one register move on the device).
__device__ __forceinline__ __half2 AsHalf2(uint32_t u) {
  __half2 h;
  memcpy(static_cast<void*>(&h), &u, 4);
  return h;
}
__device__ __forceinline__ uint32_t AsU32(__half2 h) {
  uint32_t u;
  memcpy(&u, static_cast<const void*>(&h), 4);
  return u;
}

// Channels 8c .. 8c + 7 of one token's row as eight fp16 values (a 16-byte
// chunk, lowest channel first), with packed half math: codes are planted in
// the mantissa of 1024 (0x6400 | code, exact), the bias subtracted, then
// scaled (int8, fp8: value = fp16(code * fp16(scale)); int4: fp16(code *
// scale + zero), one rounding). The same bits on the device and in the
// simulator; within one fp16 rounding of the reference decoder's floats.
// int4: chunk c's (scale, zero) is group c >> chunk_group_shift (groups of
// 8 << chunk_group_shift channels); the others ignore it. The codes are the
// row's slot-th of their width (8 bytes, int4 4): slot c unless the row is
// swizzled (KRawSwz).
template <KvElem E>
__device__ __forceinline__ uint4 DecodeChunk(const uint8_t* row, const uint8_t* meta, int c,
                                             int chunk_group_shift, int slot) {
  if constexpr (E == KvElem::kInt8) {
    const uint2 codes = reinterpret_cast<const uint2*>(row)[slot];
    const __half2 s = __float2half2_rn(*reinterpret_cast<const float*>(meta));
    const __half2 bias = __float2half2_rn(1152.0f);  // 1024 + the 128 of the sign flip
    const uint32_t w0 = codes.x ^ 0x80808080u, w1 = codes.y ^ 0x80808080u;
    const auto half_pair = [&](uint32_t w, uint32_t sel) {
      return AsU32(__hmul2(__hsub2(AsHalf2(BytePerm(w, 0x64646464u, sel)), bias), s));
    };
    return make_uint4(half_pair(w0, 0x4140), half_pair(w0, 0x4342), half_pair(w1, 0x4140),
                      half_pair(w1, 0x4342));
  } else if constexpr (E == KvElem::kFp8E4m3) {
    const uint2 codes = reinterpret_cast<const uint2*>(row)[slot];
    const __half2 s = __float2half2_rn(*reinterpret_cast<const float*>(meta));
    const auto half_pair = [&](uint32_t codes2) {
      const __half2_raw raw =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes2), __NV_E4M3);
      return AsU32(__hmul2(__half2(raw), s));
    };
    return make_uint4(half_pair(codes.x & 0xffffu), half_pair(codes.x >> 16),
                      half_pair(codes.y & 0xffffu), half_pair(codes.y >> 16));
  } else {
    static_assert(E == KvElem::kInt4);
    // The chunk's 8 channels share one (scale, zero): group sizes are
    // multiples of 8 here (MmaAttentionSupports).
    const uint32_t w = reinterpret_cast<const uint32_t*>(row)[slot];
    const __half2 sz = reinterpret_cast<const __half2*>(meta)[c >> chunk_group_shift];
    const __half2 s = __low2half2(sz), z = __high2half2(sz);
    const __half2 bias = __float2half2_rn(1024.0f);
    // r_k holds channels (k, k + 4) of the chunk.
    uint32_t r[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t h = ((w >> (4 * k)) & 0x000f000fu) | 0x64006400u;
      r[k] = AsU32(Hfma2(__hsub2(AsHalf2(h), bias), s, z));
    }
    return make_uint4(BytePerm(r[0], r[1], 0x5410), BytePerm(r[2], r[3], 0x5410),
                      BytePerm(r[0], r[1], 0x7632), BytePerm(r[2], r[3], 0x7632));
  }
}

// Decodes a stage's V rows into an fp16 tile [kMmaKeys][hd], VSwz-swizzled
// for ldmatrix.trans; 8 channels (one 16-byte chunk) per step.
template <KvElem E, int kHd>
__device__ __forceinline__ void DecodeRows(const KvPartLayout& part, const uint8_t* rows,
                                           const uint8_t* meta, uint8_t* tile) {
  constexpr int kChunks = kHd / 8;
  const int chunk_group_shift = E == KvElem::kInt4 ? Log2Pow2(part.group_size) - 3 : 0;
  // Unrolled by 2 at head_dim 256, where a full unroll spills (the 128
  // accumulators are live across the decode).
  [[maybe_unused]] constexpr int kUnroll = kHd >= 256 ? 2 : kMmaKeys * kChunks / kThreads;
#pragma unroll kUnroll
  for (int k = 0; k < kMmaKeys * kChunks / kThreads; ++k) {
    const int e = static_cast<int>(threadIdx.x) + k * kThreads;
    const int j = e / kChunks, c = e % kChunks;
    const uint8_t* row = rows + j * RowBytes<E, kHd>();
    const uint8_t* m = meta + int64_t(j) * part.meta_bytes;
    const uint4 w = DecodeChunk<E>(row, m, c, chunk_group_shift, c);
    const int pc = VSwz(j, c);
    *reinterpret_cast<uint4*>(tile + (j * kHd + 8 * pc) * 2) = w;
  }
}

// Q (or the sink query) of the CTA's nq query vectors into a [16][hd] tile
// of the compute type, K-swizzled; rows past nq are zeros.
template <bool kBf16, int hd>
__device__ __forceinline__ void LoadQTile(const KernelArgs& a, const void* q, uint8_t* tile,
                                          int row_begin, int head0, int nq) {
  const int hpc = a.heads_per_cta;
#pragma unroll
  for (int e = static_cast<int>(threadIdx.x); e < 16 * hd / 2; e += kThreads) {
    const int m = (2 * e) / hd, c = (2 * e) % hd;
    float x = 0.0f, y = 0.0f;
    if (m < nq) {
      const int64_t o = (row_begin + m / hpc) * a.q_stride + int64_t(head0 + m % hpc) * hd + c;
      x = LoadAct(q, a.dtype, o);
      y = LoadAct(q, a.dtype, o + 1);
    }
    const int pc = KSwz(m, c / 8);
    *reinterpret_cast<uint32_t*>(tile + (int64_t(m) * hd + 8 * pc + c % 8) * 2) =
        PackHalf2<kBf16>(x, y);
  }
}

// Where Scores finds a K row's 8-channel chunk c (channels 8c .. 8c + 7) as
// 8 values of the compute type: fp16 and bf16 pages in place (KSwz rows of
// the stage); quantized pages decoded from the stage's codes in registers
// (KRawSwz rows, the key's scales beside them), each code decoded once.
template <KvElem KE, int kHd>
struct KRows {
  const uint8_t* rows;  // the stage's K rows
  const uint8_t* meta;  // the stage's K scales (quantized)
  int meta_bytes;
  int chunk_group_shift;  // int4 (DecodeChunk)
  __device__ __forceinline__ uint4 Chunk(int row, int c) const {
    if constexpr (IsHalfElem(KE)) {
      return *reinterpret_cast<const uint4*>(rows + row * (kHd * 2) + 16 * KSwz(row, c));
    } else {
      constexpr int kRow = RowBytes<KE, kHd>();
      // int8 and fp8: two 8-byte code groups a 16-byte chunk; int4 four of 4.
      constexpr int kPer16 = KE == KvElem::kInt4 ? 4 : 2;
      const int slot = kPer16 * KRawSwz<KE, kHd>(row, c / kPer16) + c % kPer16;
      return DecodeChunk<KE>(rows + row * kRow, meta + row * meta_bytes, c, chunk_group_shift,
                             slot);
    }
  }
};

// S (2 n-tiles of 8 keys: kw0 + 8nt + g) of one warp from a Q tile and K rows.
template <bool kBf16, int hd, typename KSource>
__device__ __forceinline__ void Scores(float (&s)[2][4], const uint8_t* q_tile, const KSource& k,
                                       int kw0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
  }
  constexpr int stride = hd * 2;
  // Unrolled by 4 at head_dim 256, where the full unroll spills.
  [[maybe_unused]] constexpr int kUnrollG = hd >= 256 ? 4 : hd / 32;
#pragma unroll kUnrollG
  for (int G = 0; G < hd / 32; ++G) {
    const uint4 qa = *reinterpret_cast<const uint4*>(q_tile + g * stride + 16 * KSwz(g, 4 * G + t));
    const uint4 qb =
        *reinterpret_cast<const uint4*>(q_tile + (g + 8) * stride + 16 * KSwz(g + 8, 4 * G + t));
    const uint32_t a0[4] = {qa.x, qb.x, qa.y, qb.y};
    const uint32_t a1[4] = {qa.z, qb.z, qa.w, qb.w};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const uint4 kb = k.Chunk(kw0 + 8 * nt + g, 4 * G + t);
      const uint32_t b0[2] = {kb.x, kb.y};
      const uint32_t b1[2] = {kb.z, kb.w};
      Mma<kBf16>(s[nt], a0, b0);
      Mma<kBf16>(s[nt], a1, b1);
    }
  }
}

// One work item of the fast kernel (all threads of the CTA).
template <KvElem KE, KvElem VE, int kHd>
__device__ __forceinline__ void MmaAttentionItem(const KernelArgs& a,
                                                 const GpuAttentionWorkItem item) {
  constexpr bool kBf16 = KE == KvElem::kBf16;
  static_assert(!(KE == KvElem::kBf16) || VE == KvElem::kBf16, "bf16 pages are bf16 on both sides");

  const KvPageLayout& layout = a.kv.layout;
  constexpr int hd = kHd;
  const int lbs = __ffs(layout.block_size) - 1;
  // int4 K: a chunk's group by a shift (KRows, DecodeChunk); 0 for the others.
  const int k_group_shift = KE == KvElem::kInt4 ? Log2Pow2(layout.k.group_size) - 3 : 0;
  const int hpc = a.heads_per_cta;
  const int head0 = static_cast<int>(blockIdx.y) * hpc;
  const int kv_head = head0 / a.group;
  const int nq = item.num_rows * hpc;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int32_t first_index = a.batch.CacheIndex(item.seq, item.row_begin);
  const int32_t* table = a.batch.BlockRow(item.seq);
  const int32_t sinks = a.num_sinks != nullptr ? a.num_sinks[item.seq] : 0;
  const MmaSmem sl = MmaSmemLayout(layout, a.num_sinks != nullptr);

#if defined(CUDA_SIM_DYNAMIC_SHARED)
  uint8_t* smem = static_cast<uint8_t*>(::cuda_sim::g_dynamic_shared);
#else
  extern __shared__ float4 mma_smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(mma_smem4);
#endif
  uint8_t* q_tile = smem + sl.q;
  uint8_t* sink_tile = sl.sink_q >= 0 ? smem + sl.sink_q : nullptr;
  LoadQTile<kBf16, hd>(a, a.q, q_tile, item.row_begin, head0, nq);
  if (sink_tile != nullptr) LoadQTile<kBf16, hd>(a, a.sink_q, sink_tile, item.row_begin, head0, nq);

  const int key_begin = item.key_begin, key_end = item.key_end;
  // This lane's two query rows (g, g + 8) take keys [lo, lo + span] (one
  // unsigned compare a score): from the window start to the row's cache
  // index capped by the item's end; a row with no key here gets a lo past
  // every key. A row past nq takes every key: its Q row is zeros, its
  // scores finite, and nothing of it is written.
  int32_t row_lo[2];
  uint32_t row_span[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = g + 8 * r;
    const int32_t index = first_index + m / hpc;
    const int32_t lo = KeyBegin(index, a.sliding_window), hi = min(index, key_end - 1);
    row_lo[r] = m >= nq ? 0 : hi >= lo ? lo : INT32_MAX;
    row_span[r] = m >= nq ? UINT32_MAX : hi >= lo ? static_cast<uint32_t>(hi - lo) : 0u;
  }
  // Scores in log2 units: exp2 of (s - max) is one ex2 instruction.
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = a.scale * kLog2e;
  const int num_tiles = (key_end - key_begin + kMmaKeys - 1) / kMmaKeys;
  const HeadOffsets off{
      layout.RowOffset(layout.k, kv_head, 0), layout.RowOffset(layout.v, kv_head, 0),
      layout.MetaOffset(layout.k, kv_head, 0), layout.MetaOffset(layout.v, kv_head, 0)};
  const auto issue = [&](int tile) {
    uint8_t* stage = smem + sl.ring + int64_t(tile % kMmaStages) * sl.stage;
    const int32_t t0 = key_begin + tile * kMmaKeys;
    IssueTile<KE, VE, hd>(a, off, stage, sl, t0, min(kMmaKeys, key_end - t0), table, lbs);
  };

#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < num_tiles) issue(s);
    mma::CpAsyncCommit();
  }

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  constexpr int ntiles = hd / 8;
  float acc[ntiles][4];  // n-tile n: O[g][8n + 2t, +1], O[g + 8][8n + 2t, +1]
#pragma unroll
  for (int n = 0; n < ntiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    KV_COST_MARK("tile_begin");
    if (tile + kMmaStages - 1 < num_tiles) issue(tile + kMmaStages - 1);
    mma::CpAsyncCommit();
    mma::CpAsyncWait<kMmaStages - 1>();
    __syncthreads();  // every thread's copies of this tile have landed
    uint8_t* stage = smem + sl.ring + int64_t(tile % kMmaStages) * sl.stage;
    const KRows<KE, hd> k_rows{stage + sl.k_rows, stage + sl.k_meta, layout.k.meta_bytes,
                               k_group_shift};
    const uint8_t* v_tile = stage + sl.v_rows;
    if constexpr (!IsHalfElem(VE)) {
      DecodeRows<VE, hd>(layout.v, stage + sl.v_rows, stage + sl.v_meta, smem + sl.v16);
      v_tile = smem + sl.v16;
      __syncthreads();
    }

    const int32_t t0 = key_begin + tile * kMmaKeys;
    const int kw0 = 16 * warp;
    if (t0 + kw0 < key_end) {  // warp-uniform
      float s[2][4];
      Scores<kBf16, hd>(s, q_tile, k_rows, kw0, lane);
      if (t0 + kw0 < sinks) {  // some of this warp's keys are sinks
        KV_COST_MARK("sinks_begin");
        float ss[2][4];
        Scores<kBf16, hd>(ss, sink_tile, k_rows, kw0, lane);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (t0 + kw0 + 8 * nt + 2 * t + (i & 1) < sinks) s[nt][i] = ss[nt][i];
          }
        }
        KV_COST_MARK("sinks_end");
      }
      // Scale and masks, then the online softmax of rows g and g + 8.
      float p[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int i = 2 * r + c;
            const int32_t key = t0 + kw0 + 8 * nt + 2 * t + c;
            const bool valid = static_cast<uint32_t>(key - row_lo[r]) <= row_span[r];
            s[nt][i] = valid ? s[nt][i] * scale_log2 : -INFINITY;
            mx = fmaxf(mx, s[nt][i]);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(m_run[r], mx);
        float alpha = 1.0f, sum = 0.0f;
        if (new_max != -INFINITY) alpha = exp2f(m_run[r] - new_max);  // -inf - x gives 0
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int i = 2 * r + c;
            p[nt][i] = new_max != -INFINITY ? exp2f(s[nt][i] - new_max) : 0.0f;
            sum += p[nt][i];
          }
        }
        l_run[r] = l_run[r] * alpha + sum;
        m_run[r] = new_max;
        if (alpha != 1.0f) {  // the running max moved (rare after the first tiles)
          KV_COST_MARK("rescale_begin");
#pragma unroll
          for (int n = 0; n < ntiles; ++n) {
            acc[n][2 * r] *= alpha;
            acc[n][2 * r + 1] *= alpha;
          }
          KV_COST_MARK("rescale_end");
        }
      }
      const uint32_t pa[4] = {
          PackHalf2<kBf16>(p[0][0], p[0][1]), PackHalf2<kBf16>(p[0][2], p[0][3]),
          PackHalf2<kBf16>(p[1][0], p[1][1]), PackHalf2<kBf16>(p[1][2], p[1][3])};
      // O += P V: ldmatrix.trans of keys kw0 .. kw0 + 15, 16 channels at a time.
      const int vrow = kw0 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const uint8_t* vbase = v_tile + vrow * hd * 2;
#pragma unroll
      for (int np = 0; np < hd / 16; ++np) {
        uint32_t r[4];
        mma::LdmatrixX4Trans(r, vbase + 16 * VSwz(vrow, 2 * np + (lane >> 4)));
        const uint32_t b0[2] = {r[0], r[1]};
        const uint32_t b1[2] = {r[2], r[3]};
        Mma<kBf16>(acc[2 * np], pa, b0);
        Mma<kBf16>(acc[2 * np + 1], pa, b1);
      }
    }
    __syncthreads();  // the stage (and decoded tiles) are consumed
    KV_COST_MARK("tile_end");
  }
  mma::CpAsyncWait<0>();  // only empty groups can remain
  __syncthreads();

  // Merge the four warps: each writes its rows' (max, sum) and O.
  float* mw = reinterpret_cast<float*>(smem + sl.merge);  // [4][16]
  float* lw = mw + kWarps * 16;                           // [4][16]
  float* ow = lw + kWarps * 16;                           // [4][16][hd]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    if (t == 0) {
      mw[warp * 16 + g + 8 * r] = m_run[r];
      lw[warp * 16 + g + 8 * r] = l_run[r];
    }
  }
#pragma unroll
  for (int n = 0; n < ntiles; ++n) {
    float* o0 = ow + (warp * 16 + g) * hd + 8 * n + 2 * t;
    reinterpret_cast<float2*>(o0)[0] = make_float2(acc[n][0], acc[n][1]);
    reinterpret_cast<float2*>(o0 + 8 * hd)[0] = make_float2(acc[n][2], acc[n][3]);
  }
  __syncthreads();

  for (int e = tid; e < nq * hd; e += kThreads) {
    const int m = e / hd, c = e % hd;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, mw[w * 16 + m]);
    float sum = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float mwv = mw[w * 16 + m];
        if (mwv == -INFINITY) continue;  // this warp saw none of the row's keys
        const float f = exp2f(mwv - mx);
        sum += f * lw[w * 16 + m];
        o += f * ow[(int64_t(w) * 16 + m) * hd + c];
      }
    }
    const int64_t row = item.row_begin + m / hpc;
    const int head = head0 + m % hpc;
    mx *= 1.0f / kLog2e;  // the reference kernels' units (natural log) for stats and slots
    if (item.partial < 0) {
      StoreAct(a.out, a.dtype, row * a.out_stride + int64_t(head) * hd + c, o / sum);
      if (a.softmax_stats != nullptr && c == 0) {
        float* st = a.softmax_stats + (row * a.num_heads + head) * 2;
        st[0] = mx;
        st[1] = sum;
      }
    } else {
      float* slot = a.workspace + (item.partial + m / hpc) * a.slot_floats;
      slot[2 * a.num_heads + int64_t(head) * hd + c] = o;
      if (c == 0) {
        slot[2 * head] = mx;
        slot[2 * head + 1] = sum;
      }
    }
  }
}

// CTA x takes items x, x + gridDim.x, ... (ForEachWorkItem).
template <KvElem KE, KvElem VE, int kHd>
__global__ void __launch_bounds__(kThreads, 1)
    MmaAttentionKernel(const __grid_constant__ KernelArgs a) {
  ForEachWorkItem(a, [&](const GpuAttentionWorkItem& w) { MmaAttentionItem<KE, VE, kHd>(a, w); });
}

template <KvElem KE, KvElem VE>
KernelFn MmaKernelOfHeadDim(int hd) {
  switch (hd) {
    case 64:
      return MmaAttentionKernel<KE, VE, 64>;
    case 128:
      return MmaAttentionKernel<KE, VE, 128>;
    case 256:
      return MmaAttentionKernel<KE, VE, 256>;
    default:
      return nullptr;
  }
}

// The fast kernel of a KV format and head_dim, null where the reference
// kernel must run (fp32, int4_kc, other head_dims). Eighteen instantiations:
// six formats x head_dim 64, 128, 256 (head_dim is a template parameter so
// the accumulators are exactly sized and every loop unrolls).
inline KernelFn MmaAttentionKernelFor(KvElem k, KvElem v, int hd) {
  if (k == KvElem::kInt8 && v == KvElem::kInt4) {
    return MmaKernelOfHeadDim<KvElem::kInt8, KvElem::kInt4>(hd);
  }
  if (k != v) return nullptr;
  switch (k) {
    case KvElem::kFp16:
      return MmaKernelOfHeadDim<KvElem::kFp16, KvElem::kFp16>(hd);
    case KvElem::kBf16:
      return MmaKernelOfHeadDim<KvElem::kBf16, KvElem::kBf16>(hd);
    case KvElem::kFp8E4m3:
      return MmaKernelOfHeadDim<KvElem::kFp8E4m3, KvElem::kFp8E4m3>(hd);
    case KvElem::kInt8:
      return MmaKernelOfHeadDim<KvElem::kInt8, KvElem::kInt8>(hd);
    case KvElem::kInt4:
      return MmaKernelOfHeadDim<KvElem::kInt4, KvElem::kInt4>(hd);
    default:
      return nullptr;
  }
}

}  // namespace kvserve::cuda::attention_detail
