#include "kernels/cpu/quant/quant_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/quant/quant_internal.h"

namespace kvserve::cpu {
namespace {

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Round to nearest even for |v| < 2^22 (every value quantized here is at
// most 127 in magnitude): adding and subtracting 1.5 * 2^23 leaves the
// rounded value, without a libm call, and vectorizes.
inline float RoundSmall(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

inline int ClampQ(float v, int lim) {
  const int q = static_cast<int>(RoundSmall(v));
  return std::clamp(q, -lim, lim);
}

// q = round(w / s) for an int4 group, as w times the scale's inverse (one
// division a group, not one a weight) clamped to [-8, 7]; the packing and
// every trial below use this one rounding.
inline int Int4Level(float w, float inv_s) {
  return static_cast<int>(std::clamp(RoundSmall(w * inv_s), -8.0f, 7.0f));
}

// One trial of a group scale s (nonzero) on w (wd: the same values in
// double, w2 = sum wd^2): the levels' sums sum w q and sum q^2, which give
// both the squared error, w2 - 2 s sum w q + s^2 sum q^2, and the
// least-squares scale for those levels, sum w q / sum q^2. Four chains
// keep the double adds in flight.
struct Int4Trial {
  double err = 0, wq = 0, qq = 0;
};
Int4Trial TryInt4Scale(const float* w, const double* wd, double w2, int64_t n, float s) {
  const float inv = 1.0f / s;
  double wq[4] = {0, 0, 0, 0};
  int32_t qq = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) {
      const float q = std::clamp(RoundSmall(w[k + j] * inv), -8.0f, 7.0f);
      wq[j] += wd[k + j] * double(q);
      qq += static_cast<int32_t>(q * q);
    }
  }
  for (; k < n; ++k) {
    const float q = std::clamp(RoundSmall(w[k] * inv), -8.0f, 7.0f);
    wq[0] += wd[k] * double(q);
    qq += static_cast<int32_t>(q * q);
  }
  Int4Trial t;
  t.wq = (wq[0] + wq[1]) + (wq[2] + wq[3]);
  t.qq = qq;
  t.err = w2 - 2.0 * double(s) * t.wq + double(s) * double(s) * t.qq;
  return t;
}

// An int4 group's scale, as fp16: q = round(w / s) in [-8, 7]. As llama.cpp's
// q4_0, the weight of largest magnitude m maps to -8 (s = m / -8), which
// uses all 16 levels. Around it, scales m f / -8 for f from 1.12 down to
// 0.76 in steps of 0.03 are tried (below 1 the extreme is clipped a little,
// which often lowers the error of all the others; above 1 the other side
// gets a level closer), then up to two least-squares refits of the best
// (sum w q / sum q^2 for the levels it chose: the refit of llama.cpp's
// make_qx_quants); the scale with the least squared error is kept, the
// first of equals. The candidates include the plain m / -8 and the
// shrinking steps of the search before this one (f = 1 to 0.76), so no
// group's error is larger than under either
// (tests/kernels/cpu/int4_scale_test.cc). On stories260K (group 32) the dev
// text's int4 perplexity loss went from +9.6% (m / -8 alone) and +8.5% (the
// shrinking steps) to +8.2%. Weighting the error by w^2 or by the preceding
// RMSNorm's gains made it worse (+9.0%, +8.6%), and a refit after every
// candidate (twice the trials) lowered the error by under 0.1% more.
uint16_t Int4GroupScale(const float* w, int64_t n) {
  float m = 0.0f;
  for (int64_t k = 0; k < n; ++k) m = std::fabs(w[k]) > std::fabs(m) ? w[k] : m;
  if (m == 0.0f) return 0;
  thread_local std::vector<double> wd;
  wd.resize(n);
  double w2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    wd[k] = w[k];
    w2 += wd[k] * wd[k];
  }
  uint16_t best = 0;
  double best_err = -1;
  uint16_t tried[32];
  int num_tried = 0;
  // Tries a scale as fp16, once, and returns the trial; nullopt for a
  // zero, a NaN or an already tried scale.
  auto trial = [&](float scale) -> std::optional<Int4Trial> {
    const uint16_t s16 = FloatToFp16(std::clamp(scale, -kFp16Max, kFp16Max));
    const float s = Fp16ToFloat(s16);
    if (s == 0.0f || std::isnan(s)) return std::nullopt;
    if (std::find(tried, tried + num_tried, s16) != tried + num_tried) return std::nullopt;
    tried[num_tried++] = s16;
    const Int4Trial t = TryInt4Scale(w, wd.data(), w2, n, s);
    if (best_err < 0 || t.err < best_err) {
      best_err = t.err;
      best = s16;
    }
    return t;
  };
  std::optional<Int4Trial> best_trial;
  for (int step = -4; step <= 8; ++step) {
    const uint16_t before = best;
    const std::optional<Int4Trial> t = trial(m * (1.0f - 0.03f * step) / -8.0f);
    if (t && best != before) best_trial = t;
  }
  // Two least-squares refits of the best: the levels it chose, then the
  // refit's levels.
  for (int it = 0; it < 2 && best_trial && best_trial->qq > 0; ++it) {
    const uint16_t before = best;
    const std::optional<Int4Trial> t = trial(static_cast<float>(best_trial->wq / best_trial->qq));
    if (!t || best == before) break;
    best_trial = t;
  }
  return best;
}

}  // namespace

double Int4GroupError(const float* w, int64_t n, float scale) {
  if (scale == 0.0f) {
    double e = 0;
    for (int64_t k = 0; k < n; ++k) e += double(w[k]) * w[k];
    return e;
  }
  std::vector<double> wd(w, w + n);
  double w2 = 0;
  for (int64_t k = 0; k < n; ++k) w2 += wd[k] * wd[k];
  return TryInt4Scale(w, wd.data(), w2, n, scale).err;
}

std::string_view QuantKindName(QuantKind kind) {
  return kind == QuantKind::kInt8 ? "int8" : "int4";
}

void QuantMatrix::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

QuantMatrix QuantMatrix::Quantize(const float* w, int64_t out, int64_t in, QuantKind kind,
                                  int group_size) {
  QuantMatrix m;
  m.kind_ = kind;
  m.out_ = out;
  m.in_ = in;
  if (out <= 0 || in <= 0) {
    m.out_ = 0;
    return m;
  }
  const int64_t nb = m.num_blocks();
  if (kind == QuantKind::kInt8) {
    m.k_padded_ = RoundUp(in, 4);
    m.group_ = static_cast<int>(m.k_padded_);
    m.block_stride_ = m.k_padded_ * kQuantBlock;  // [K/4][16][4]: a multiple of 64
  } else {
    if (group_size <= 0 || group_size % 8 != 0) std::abort();  // callers validate
    m.group_ = group_size;
    m.k_padded_ = RoundUp(in, group_size);
    const int64_t groups = m.k_padded_ / group_size;
    m.scale_offset_ = m.k_padded_ * kQuantBlock / 2;  // nibbles
    m.block_stride_ = RoundUp(m.scale_offset_ + groups * kQuantBlock * 2, 64);
  }
  const int64_t total = nb * m.block_stride_;
  m.data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, RoundUp(total, 64))));
  if (m.data_ == nullptr) std::abort();
  // Padding: int8 q = 0; int4 nibble 8 (q = 0) and scale 0.
  std::memset(m.data_.get(), kind == QuantKind::kInt8 ? 0 : 0x88, total);
  if (kind == QuantKind::kInt4) {
    for (int64_t b = 0; b < nb; ++b) {
      std::memset(m.data_.get() + b * m.block_stride_ + m.scale_offset_, 0,
                  m.block_stride_ - m.scale_offset_);
    }
  }

  if (kind == QuantKind::kInt8) {
    m.channel_scales_.assign(nb * kQuantBlock, 0.0f);
    m.channel_sums_.assign(nb * kQuantBlock, 0);
    for (int64_t o = 0; o < out; ++o) {
      const float* wr = w + o * in;
      float amax = 0.0f;
      for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(wr[k]));
      // q = round(w / s), the textbook rounding (load time: no hurry).
      const float scale = amax / 127.0f;
      m.channel_scales_[o] = scale;
      uint8_t* blk = m.data_.get() + (o / kQuantBlock) * m.block_stride_ + (o % kQuantBlock) * 4;
      int32_t sum = 0;
      for (int64_t k = 0; k < in; ++k) {
        const int q = scale > 0.0f ? ClampQ(wr[k] / scale, 127) : 0;
        blk[(k / 4) * 64 + (k % 4)] = static_cast<uint8_t>(static_cast<int8_t>(q));
        sum += q;
      }
      m.channel_sums_[o] = sum;
    }
    return m;
  }

  const int64_t g_size = m.group_;
  for (int64_t o = 0; o < out; ++o) {
    const float* wr = w + o * in;
    uint8_t* blk = m.data_.get() + (o / kQuantBlock) * m.block_stride_;
    const int lane = static_cast<int>(o % kQuantBlock);
    for (int64_t g = 0; g * g_size < in; ++g) {
      const int64_t k0 = g * g_size, k1 = std::min(in, k0 + g_size);
      const uint16_t s16 = Int4GroupScale(wr + k0, k1 - k0);
      const float s = Fp16ToFloat(s16), inv = s != 0.0f ? 1.0f / s : 0.0f;
      std::memcpy(blk + m.scale_offset_ + (g * kQuantBlock + lane) * 2, &s16, 2);
      for (int64_t k = k0; k < k1; ++k) {
        const int q = Int4Level(wr[k], inv);
        const int64_t kk = k - k0;
        uint8_t& byte = blk[(k0 / 8 + kk / 8) * 64 + lane * 4 + (kk % 4)];
        const uint8_t u = static_cast<uint8_t>(q + 8);
        byte = (kk % 8) < 4 ? static_cast<uint8_t>((byte & 0xF0) | u)
                            : static_cast<uint8_t>((byte & 0x0F) | (u << 4));
      }
    }
  }
  return m;
}

int64_t QuantMatrix::bytes() const {
  return num_blocks() * block_stride_ +
         static_cast<int64_t>(channel_scales_.size() * sizeof(float) +
                              channel_sums_.size() * sizeof(int32_t));
}

int64_t QuantMatrix::BytesFor(int64_t out, int64_t in, QuantKind kind, int group_size) {
  if (out <= 0 || in <= 0) return 0;
  const int64_t nb = (out + kQuantBlock - 1) / kQuantBlock;
  if (kind == QuantKind::kInt8) {
    const int64_t kp = RoundUp(in, 4);
    return nb * kp * kQuantBlock + nb * kQuantBlock * int64_t{sizeof(float) + sizeof(int32_t)};
  }
  const int64_t kp = RoundUp(in, group_size), groups = kp / group_size;
  return nb * RoundUp(kp * kQuantBlock / 2 + groups * kQuantBlock * 2, 64);
}

int QuantMatrix::QuantAt(int64_t o, int64_t k) const {
  const uint8_t* blk = block(o / kQuantBlock);
  const int lane = static_cast<int>(o % kQuantBlock);
  if (kind_ == QuantKind::kInt8) {
    return static_cast<int8_t>(blk[(k / 4) * 64 + lane * 4 + (k % 4)]);
  }
  const uint8_t byte = blk[(k / 8) * 64 + lane * 4 + (k % 4)];
  return ((k % 8) < 4 ? (byte & 0x0F) : (byte >> 4)) - 8;
}

float QuantMatrix::ScaleAt(int64_t o, int64_t g) const {
  if (kind_ == QuantKind::kInt8) return channel_scales_[o];
  uint16_t s16;
  std::memcpy(&s16,
              block(o / kQuantBlock) + scale_offset_ + (g * kQuantBlock + o % kQuantBlock) * 2, 2);
  return Fp16ToFloat(s16);
}

void QuantizeActivationRow(const float* x, int64_t in, int64_t k_padded, int group, int8_t* hi,
                           uint8_t* lo, float* scale, int32_t* hi_sums, int32_t* lo_sums) {
  float amax = 0.0f;
  for (int64_t k = 0; k < in; ++k) {
    const float a = std::fabs(x[k]);
    amax = a > amax ? a : amax;
  }
  const float inv = amax > 0.0f ? static_cast<float>(kActMax) / amax : 0.0f;
  *scale = amax / static_cast<float>(kActMax);
  for (int64_t k = 0; k < in; ++k) {
    const int v = ClampQ(x[k] * inv, kActMax);
    hi[k] = static_cast<int8_t>(v >> 7);  // floor(v / 128): v = 128 hi + lo
    lo[k] = static_cast<uint8_t>(v & 127);
  }
  std::memset(hi + in, 0, k_padded - in);
  std::memset(lo + in, 0, k_padded - in);
  if (hi_sums == nullptr || lo_sums == nullptr) return;
  for (int64_t g = 0; g * group < k_padded; ++g) {
    int32_t sh = 0, sl = 0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) {
      sh += hi[k];
      sl += lo[k];
    }
    hi_sums[g] = sh;
    lo_sums[g] = sl;
  }
}

namespace internal {

// 128 h + l recombined in float, as every kernel does.
inline float Combine(int32_t acc_h, int32_t acc_l) {
  return static_cast<float>(acc_h) * 128.0f + static_cast<float>(acc_l);
}

void Q8Scalar(const QuantGemmArgs& a) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded();
  for (int64_t r = 0; r < a.rows; ++r) {
    const int8_t* xh = a.xh + r * kp;
    const uint8_t* xl = a.xl + r * kp;
    for (int64_t b = a.b_begin; b < a.b_end; ++b) {
      const int8_t* blk = reinterpret_cast<const int8_t*>(w.block(b));
      for (int j = 0; j < kQuantBlock; ++j) {
        int32_t acc_h = 0, acc_l = 0;
        for (int64_t k = 0; k < kp; ++k) {
          const int q = blk[(k / 4) * 64 + j * 4 + (k % 4)];
          acc_h += xh[k] * q;
          acc_l += xl[k] * q;
        }
        const float scale = w.channel_scales()[b * kQuantBlock + j] * a.xscale[r];
        a.out[r * a.ldo + (b - a.b_begin) * kQuantBlock + j] = Combine(acc_h, acc_l) * scale;
      }
    }
  }
}

void Q4Scalar(const QuantGemmArgs& a) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), g_size = w.group_size();
  for (int64_t r = 0; r < a.rows; ++r) {
    const int8_t* xh = a.xh + r * kp;
    const uint8_t* xl = a.xl + r * kp;
    for (int64_t b = a.b_begin; b < a.b_end; ++b) {
      const uint8_t* blk = w.block(b);
      for (int j = 0; j < kQuantBlock; ++j) {
        float facc = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t acc_h = -8 * a.sum_h[r * groups + g], acc_l = -8 * a.sum_l[r * groups + g];
          for (int64_t k = g * g_size; k < (g + 1) * g_size; ++k) {
            const uint8_t byte = blk[(k / 8) * 64 + j * 4 + (k % 4)];
            const int u = (k % 8) < 4 ? (byte & 0x0F) : (byte >> 4);
            acc_h += xh[k] * u;
            acc_l += xl[k] * u;
          }
          uint16_t s16;
          std::memcpy(&s16, blk + w.scale_offset() + (g * kQuantBlock + j) * 2, 2);
          facc = std::fma(Combine(acc_h, acc_l), Fp16ToFloat(s16), facc);
        }
        a.out[r * a.ldo + (b - a.b_begin) * kQuantBlock + j] = facc * a.xscale[r];
      }
    }
  }
}

}  // namespace internal

std::string_view QuantKernelName(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kBest:
      return "best";
    case QuantKernel::kVnni512:
      return "avx512_vnni";
    case QuantKernel::kAvx2:
      return "avx2";
    case QuantKernel::kScalar:
      return "scalar";
  }
  return "?";
}

bool QuantKernelAvailable(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kBest:
    case QuantKernel::kScalar:
      return true;
#if defined(__x86_64__)
    case QuantKernel::kAvx2:
      return CpuHasAvx2();
    case QuantKernel::kVnni512:
      return CpuHasAvx512Vnni();
#endif
    default:
      return false;
  }
}

QuantKernel BestQuantKernel() {
  if (DefaultCpuIsa() != CpuIsa::kAvx2) return QuantKernel::kScalar;
  return Avx512Allowed() ? QuantKernel::kVnni512 : QuantKernel::kAvx2;
}

void QuantLinear(const float* x, int64_t rows, const QuantMatrix& w, int64_t o_begin, int64_t o_end,
                 float* y, int64_t ldy, bool accumulate, QuantKernel kernel) {
  o_end = std::min(o_end, w.out());
  if (rows <= 0 || o_end <= o_begin || w.empty()) return;
  if (kernel == QuantKernel::kBest) kernel = BestQuantKernel();
  if (!QuantKernelAvailable(kernel)) kernel = QuantKernel::kScalar;
  const bool int4 = w.kind() == QuantKind::kInt4;
  const int64_t kp = w.k_padded(), groups = w.num_groups();
  thread_local std::vector<int8_t> xh;
  thread_local std::vector<uint8_t> xhu, xl;
  thread_local std::vector<float> xscale, out;
  thread_local std::vector<int32_t> sum_h, sum_l;
  auto grow = [](auto& v, size_t n) { v.resize(std::max(v.size(), n)); };
  grow(xh, rows * kp);
  grow(xl, rows * kp);
  grow(xscale, rows);
  if (int4) {
    grow(sum_h, rows * groups);
    grow(sum_l, rows * groups);
  }
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeActivationRow(x + r * w.in(), w.in(), kp, w.group_size(), xh.data() + r * kp,
                          xl.data() + r * kp, &xscale[r],
                          int4 ? sum_h.data() + r * groups : nullptr,
                          int4 ? sum_l.data() + r * groups : nullptr);
  }
  internal::QuantGemmArgs a;
  a.w = &w;
  a.xh = xh.data();
  a.xl = xl.data();
  a.xscale = xscale.data();
  a.sum_h = sum_h.data();
  a.sum_l = sum_l.data();
  a.rows = rows;
  a.b_begin = o_begin / kQuantBlock;
  a.b_end = (o_end + kQuantBlock - 1) / kQuantBlock;
  a.ldo = (a.b_end - a.b_begin) * kQuantBlock;
  grow(out, rows * a.ldo);
  a.out = out.data();
  if (!int4 && kernel == QuantKernel::kVnni512) {
    grow(xhu, rows * kp);
    for (int64_t i = 0; i < rows * kp; ++i) xhu[i] = static_cast<uint8_t>(xh[i]) ^ 0x80;
    a.xhu = xhu.data();
  }
  switch (kernel) {
#if defined(__x86_64__)
    case QuantKernel::kVnni512:
      int4 ? internal::Q4Vnni512(a) : internal::Q8Vnni512(a);
      break;
    case QuantKernel::kAvx2:
      int4 ? internal::Q4Avx2(a) : internal::Q8Avx2(a);
      break;
#endif
    default:
      int4 ? internal::Q4Scalar(a) : internal::Q8Scalar(a);
      break;
  }
  const int64_t skip = o_begin - a.b_begin * kQuantBlock, n = o_end - o_begin;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = out.data() + r * a.ldo + skip;
    float* dst = y + r * ldy;
    if (accumulate) {
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    } else {
      std::copy(src, src + n, dst);
    }
  }
}

}  // namespace kvserve::cpu
