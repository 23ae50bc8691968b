// Device code of the int4_kc and int2_kc writes (see kv_write_kc.h for the
// contract); the code bits (4 or 2) are the layout's, read at run time.
//
// Seal kernel. Grid: (num_seqs, num_kv_heads); block: kThreads. CTA (b, h)
// seals, one after another, the blocks sequence b's step completes, for kv
// head h:
//   1. channel min/max over the block's rows, one thread per channel, rows
//      in order with the CPU's comparisons (x < m ? x : m);
//   2. thread 0 folds the head's lo/hi over channels in order (so a -0/+0
//      tie resolves as on the CPU) and stores lo and unit; then one thread
//      per channel picks (cmin, cmax) and widens them exactly as
//      kv_quant_kc.cc's EncodeRanges, keeping scale_d and zero_d;
//   3. the codes, one thread per (row, code byte: 8 / bits channels);
//   4. V, one warp per row, kv_encode::EncodeRow (int4 or int2).
// A row's value is read where it lives (fp16 tail before the step's first
// index, this step's K/V after, rounded to fp16) each time it is needed.
// Static shared memory: 4 * kMaxHeadDim + kWarps * 2 * kMaxHeadDim floats.
//
// Tail kernel. Grid: (ceil(num_tokens * num_kv_heads * 2 / kWarps)); one
// warp per (token, part, kv head) row, as the plain KV write.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/cuda/kv/kv_write_kc.h"

namespace kvserve::cuda::kv_kc_detail {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kMaxHeadDim = kv_encode::kMaxHeadDim;
inline constexpr float kTopCode = static_cast<float>(kInt4ChannelCodes);

KV_HOST_DEVICE inline uint16_t Load16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

// x as an fp16 tail holds it.
KV_HOST_DEVICE inline float RoundToFp16(float x) {
  using namespace kv_encode;
  return Fp16ToFloat(FloatToFp16(Saturate(x, kFp16Max)));
}

// Where sequence b's rows live this step.
struct SeqRows {
  int32_t first;        // first new cache index
  int32_t row0;         // batch row of `first`
  const uint8_t* tail;  // null: none
};

// Channel c of cache index i's K (v = false) or V row for kv head h.
template <typename T>
__device__ __forceinline__ float RowValue(const KvKcWriteParams& p, const SeqRows& s, bool v, int h,
                                          int32_t i, int c) {
  const KvPageLayout& f = p.kv.layout;
  if (i < s.first) {
    return kv_encode::Fp16ToFloat(
        Load16(s.tail + f.TailRowOffset(v, h, i % f.block_size) + 2 * static_cast<int64_t>(c)));
  }
  const int64_t t = s.row0 + (i - s.first);
  const T* src =
      v ? static_cast<const T*>(p.v) + t * p.v_stride : static_cast<const T*>(p.k) + t * p.k_stride;
  return RoundToFp16(ToFloat(src[static_cast<int64_t>(h) * f.head_dim + c]));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) SealKernel(const KvKcWriteParams p) {
  using namespace exact;
  __shared__ float mn[kMaxHeadDim], mx[kMaxHeadDim], scale_s[kMaxHeadDim], zero_s[kMaxHeadDim];
  __shared__ float rows[kWarps * 2 * kMaxHeadDim];
  __shared__ float range[2];  // lo, unit
  const KvPageLayout& f = p.kv.layout;
  const int hd = f.head_dim, bs = f.block_size;
  const int bits = f.k.bits, per = 8 / bits, levels = KvCodeLevels(bits);
  const float levels_f = static_cast<float>(levels);
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32;
  const BatchView& batch = p.batch;
  if (batch.QueryLen(b) <= 0) return;
  SeqRows s;
  s.first = batch.FirstIndex(b);
  s.row0 = batch.query_start[b];
  const int32_t tail_id = batch.tail_ids != nullptr ? batch.tail_ids[b] : -1;
  s.tail = tail_id >= 0 ? p.kv.Tail(tail_id) : nullptr;
  const int32_t ctx = batch.context_len[b];
  if (s.first % bs != 0 && s.first / bs < ctx / bs && s.tail == nullptr) return;
  for (int32_t k = s.first / bs; k < ctx / bs; ++k) {  // uniform over the CTA
    uint8_t* block = p.kv.Block(batch.BlockRow(b)[k]);
    uint8_t* meta = block + f.BlockMetaOffset(f.k, h);
    const int32_t i0 = k * bs;
    // 1. Channel ranges.
    for (int d = tid; d < hd; d += kThreads) {
      float lo = RowValue<T>(p, s, false, h, i0, d), hi = lo;
      for (int j = 1; j < bs; ++j) {
        const float x = RowValue<T>(p, s, false, h, i0 + j, d);
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
      }
      mn[d] = lo;
      mx[d] = hi;
    }
    __syncthreads();
    // 2. The head's range, then each channel's codes.
    if (tid == 0) {
      float lo = mn[0], hi = mx[0];
      for (int d = 1; d < hd; ++d) {
        lo = mn[d] < lo ? mn[d] : lo;
        hi = mx[d] > hi ? mx[d] : hi;
      }
      float unit = Div(Sub(hi, lo), kTopCode * levels_f);
      if (!(unit > 0.0f) || !IsFinite(unit) || !IsFinite(lo)) {
        if (!IsFinite(lo)) lo = 0.0f;
        unit = 0.0f;
      }
      range[0] = lo;
      range[1] = unit;
      kv_encode::Store32(meta, BitsOf(lo));
      kv_encode::Store32(meta + 4, BitsOf(unit));
    }
    __syncthreads();
    const float lo = range[0], unit = range[1];
    for (int d = tid; d < hd; d += kThreads) {
      int cmin = 0, cmax = 0;
      if (unit != 0.0f) {
        const float step = Mul(levels_f, unit);
        cmin =
            static_cast<int>(kv_encode::ClampF(floorf(Div(Sub(mn[d], lo), step)), 0.0f, kTopCode));
        cmax = static_cast<int>(kv_encode::ClampF(ceilf(Div(Sub(mx[d], lo), step)),
                                                  static_cast<float>(cmin), kTopCode));
        float zero = Fma(static_cast<float>(levels * cmin), unit, lo);
        while (cmin > 0 && zero > mn[d]) {
          --cmin;
          zero = Fma(static_cast<float>(levels * cmin), unit, lo);
        }
        while (cmax < kInt4ChannelCodes &&
               Fma(levels_f, Mul(static_cast<float>(cmax - cmin), unit), zero) < mx[d]) {
          ++cmax;
        }
      }
      meta[kInt4ChannelHeader + 2 * d] = static_cast<uint8_t>(cmin);
      meta[kInt4ChannelHeader + 2 * d + 1] = static_cast<uint8_t>(cmax);
      scale_s[d] = Mul(static_cast<float>(cmax - cmin), unit);
      zero_s[d] = Fma(static_cast<float>(levels * cmin), unit, lo);
    }
    __syncthreads();
    // 3. K codes.
    const int row_bytes = hd / per;
    for (int e = tid; e < bs * row_bytes; e += kThreads) {
      const int j = e / row_bytes, q = e % row_bytes;
      uint32_t byte = 0;
      for (int c = 0; c < per; ++c) {
        const int d = per * q + c;
        if (scale_s[d] > 0.0f) {
          const float x = RowValue<T>(p, s, false, h, i0 + j, d);
          const float r = RoundEven(Div(Sub(x, zero_s[d]), scale_s[d]));
          byte |= static_cast<uint32_t>(kv_encode::ClampF(r, 0.0f, levels_f)) << (c * bits);
        }
      }
      block[f.RowOffset(f.k, h, j) + q] = static_cast<uint8_t>(byte);
    }
    // 4. V rows, one warp each.
    const kv_encode::WarpTeam team;
    float* x = rows + warp * 2 * kMaxHeadDim;
    for (int j = warp; j < bs; j += kWarps) {
      team.For(hd, [&](int c) { x[c] = RowValue<T>(p, s, true, h, i0 + j, c); });
      team.Sync();
      kv_encode::EncodeRow(team, f.v, hd, x, x + hd, block + f.RowOffset(f.v, h, j),
                           block + f.MetaOffset(f.v, h, j));
      team.Sync();
    }
    __syncthreads();  // mn/mx/scale_s/zero_s are rewritten by the next block
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) TailKernel(const KvKcWriteParams p) {
  const KvPageLayout& f = p.kv.layout;
  const int hd = f.head_dim, hkv = f.num_kv_heads, bs = f.block_size;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const BatchView& batch = p.batch;
  if (item >= static_cast<int64_t>(batch.num_tokens) * hkv * 2) return;
  const int32_t t = static_cast<int32_t>(item / (2 * hkv));
  if (t >= batch.query_start[batch.num_seqs]) return;  // padding past the real rows
  const bool v = static_cast<int>(item % (2 * hkv)) / hkv == 1;
  const int h = static_cast<int>(item % hkv);
  const int32_t b = batch.SeqOfRow(t);
  const int32_t i = batch.CacheIndex(b, t);
  if (i < batch.context_len[b] / bs * bs) return;  // its block is full: sealed
  const int32_t tail_id = batch.tail_ids != nullptr ? batch.tail_ids[b] : -1;
  if (tail_id < 0) return;
  uint8_t* dst = p.kv.Tail(tail_id) + f.TailRowOffset(v, h, i % bs);
  const T* src = (v ? static_cast<const T*>(p.v) + t * p.v_stride
                    : static_cast<const T*>(p.k) + t * p.k_stride) +
                 static_cast<int64_t>(h) * hd;
  for (int c = lane; c < hd; c += 32) {
    const float x = ToFloat(src[c]);
    kv_encode::Store16(dst + 2 * c,
                       kv_encode::FloatToFp16(kv_encode::Saturate(x, kv_encode::kFp16Max)));
  }
}

}  // namespace kvserve::cuda::kv_kc_detail
