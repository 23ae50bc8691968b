#include "kernels/cpu/quant/quant_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/cpu/quant/quant_internal.h"
#include "kernels/cpu/thread_pool.h"

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

// q = round((w - o) / s) for an int4 group (o = 0: symmetric), as w - o
// times the scale's inverse (one division a group, not one a weight)
// clamped to [-8, 7]; the packing and every trial below use this one
// rounding.
inline float Int4LevelF(float w, float inv_s, float o) {
  return std::clamp(RoundSmall((w - o) * inv_s), -8.0f, 7.0f);
}

// A group's values in double (in `buffer`, which must outlive it: one
// allocation a thread, not one a group) and their sums, for the trials.
struct Int4Group {
  const float* w;
  int64_t n;
  const double* wd;
  double w2 = 0, w1 = 0;  // sum w^2, sum w
  Int4Group(const float* w_in, int64_t n_in, std::vector<double>& buffer) : w(w_in), n(n_in) {
    buffer.assign(w_in, w_in + n_in);
    wd = buffer.data();
    for (double v : buffer) {
      w2 += v * v;
      w1 += v;
    }
  }
};

// One trial of a group scale s (nonzero) and offset o: the levels' sums
// sum w q, sum q and sum q^2, which give both the squared error
// sum (w - s q - o)^2 = w2 - 2 s wq - 2 o w1 + s^2 qq + 2 s o q1 + n o^2,
// and the least-squares (s, o) for those levels. Four chains keep the double
// adds in flight; the integer sums are exact.
struct Int4Trial {
  double err = 0, wq = 0, qq = 0, q1 = 0;
};
Int4Trial TryInt4Scale(const Int4Group& grp, float s, float o) {
  const float inv = 1.0f / s;
  const float* w = grp.w;
  const double* wd = grp.wd;
  const int64_t n = grp.n;
  double wq[4] = {0, 0, 0, 0};
  int32_t qq = 0, q1 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) {
      const float q = Int4LevelF(w[k + j], inv, o);
      wq[j] += wd[k + j] * double(q);
      qq += static_cast<int32_t>(q * q);
      q1 += static_cast<int32_t>(q);
    }
  }
  for (; k < n; ++k) {
    const float q = Int4LevelF(w[k], inv, o);
    wq[0] += wd[k] * double(q);
    qq += static_cast<int32_t>(q * q);
    q1 += static_cast<int32_t>(q);
  }
  Int4Trial t;
  t.wq = (wq[0] + wq[1]) + (wq[2] + wq[3]);
  t.qq = qq;
  t.q1 = q1;
  const double sd = s, od = o;
  t.err = grp.w2 - 2.0 * sd * t.wq + sd * sd * t.qq;
  if (o != 0.0f) t.err += -2.0 * od * grp.w1 + 2.0 * sd * od * t.q1 + double(n) * od * od;
  return t;
}

// A group's fp16 scale and offset (0 for the symmetric format).
struct Int4Params {
  uint16_t s16 = 0, o16 = 0;
};

// The candidates tried so far and the best of them.
class Int4Search {
 public:
  explicit Int4Search(const Int4Group& grp) : grp_(grp) {}
  // Tries (scale, offset) rounded to fp16, once; nullopt for a zero or NaN
  // scale, a NaN offset or a pair already tried.
  std::optional<Int4Trial> Try(float scale, float offset) {
    const Int4Params p{FloatToFp16(std::clamp(scale, -kFp16Max, kFp16Max)),
                       FloatToFp16(std::clamp(offset, -kFp16Max, kFp16Max))};
    const float s = Fp16ToFloat(p.s16), o = Fp16ToFloat(p.o16);
    if (s == 0.0f || std::isnan(s) || std::isnan(o)) return std::nullopt;
    for (int i = 0; i < num_tried_; ++i) {
      if (tried_[i].s16 == p.s16 && tried_[i].o16 == p.o16) return std::nullopt;
    }
    if (num_tried_ == kMaxTrials) std::abort();  // the searches below try fewer
    tried_[num_tried_++] = p;
    const Int4Trial t = TryInt4Scale(grp_, s, o);
    if (best_err_ < 0 || t.err < best_err_) {
      best_err_ = t.err;
      best_ = p;
      best_trial_ = t;
    }
    return t;
  }
  bool any() const { return best_err_ >= 0; }
  const Int4Params& best() const { return best_; }
  const Int4Trial& best_trial() const { return best_trial_; }

 private:
  static constexpr int kMaxTrials = 32;
  const Int4Group& grp_;
  Int4Params tried_[kMaxTrials];
  int num_tried_ = 0;
  Int4Params best_;
  Int4Trial best_trial_;
  double best_err_ = -1;
};

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
// (tests/kernels/cpu/quant/int4_scale_test.cc). On stories260K (group 32) the dev
// text's int4 perplexity loss went from +9.6% (m / -8 alone) and +8.5% (the
// shrinking steps) to +8.2%. Weighting the error by w^2 or by the preceding
// RMSNorm's gains made it worse (+9.0%, +8.6%), and a refit after every
// candidate (twice the trials) lowered the error by under 0.1% more.
Int4Params Int4GroupScale(const float* w, int64_t n) {
  float m = 0.0f;
  for (int64_t k = 0; k < n; ++k) m = std::fabs(w[k]) > std::fabs(m) ? w[k] : m;
  if (m == 0.0f) return {};
  thread_local std::vector<double> buffer;
  const Int4Group grp(w, n, buffer);
  Int4Search search(grp);
  for (int step = -4; step <= 8; ++step) search.Try(m * (1.0f - 0.03f * step) / -8.0f, 0.0f);
  // Two least-squares refits of the best: the levels it chose, then the
  // refit's levels.
  for (int it = 0; it < 2 && search.any() && search.best_trial().qq > 0; ++it) {
    const Int4Params before = search.best();
    search.Try(static_cast<float>(search.best_trial().wq / search.best_trial().qq), 0.0f);
    if (search.best().s16 == before.s16) break;
  }
  return search.best();
}

// An int4_asym group's scale and offset, w ~ s q + o with q in [-8, 7] (as
// llama.cpp's q4_1 with its minimum at q = -8): the symmetric choice above
// (o = 0) is the first candidate, so no group's error is larger than under
// int4; then the min/max fit, s = (max - min) / (15 + 0.1 j) for j in [-5,
// 5] with o = min + 8 s, each followed by the least-squares (s, o) for the
// levels it chose, and two refits of the best.
Int4Params Int4GroupScaleOffset(const float* w, int64_t n) {
  const Int4Params sym = Int4GroupScale(w, n);
  if (sym.s16 == 0) return sym;  // all zeros
  float mn = w[0], mx = w[0];
  for (int64_t k = 1; k < n; ++k) {
    mn = std::min(mn, w[k]);
    mx = std::max(mx, w[k]);
  }
  thread_local std::vector<double> buffer;
  const Int4Group grp(w, n, buffer);
  Int4Search search(grp);
  search.Try(Fp16ToFloat(sym.s16), 0.0f);
  // One value: q = 0 and the offset carries it.
  if (mx == mn) search.Try(Fp16ToFloat(sym.s16), mn);
  // Least-squares (s, o) for the levels of a trial: the 2 x 2 normal
  // equations in q and 1.
  auto refit = [&](const Int4Trial& t) {
    const double nn = static_cast<double>(n), det = nn * t.qq - t.q1 * t.q1;
    if (det <= 0) return;
    const double s = (nn * t.wq - t.q1 * grp.w1) / det;
    const double o = (t.qq * grp.w1 - t.q1 * t.wq) / det;
    search.Try(static_cast<float>(s), static_cast<float>(o));
  };
  for (int step = -5; step <= 5; ++step) {
    const float s = (mx - mn) / (15.0f + 0.1f * step);
    const std::optional<Int4Trial> t = search.Try(s, mn + 8.0f * s);
    if (t) refit(*t);
  }
  for (int it = 0; it < 2 && search.any(); ++it) refit(search.best_trial());
  return search.best();
}

}  // namespace

double Int4GroupError(const float* w, int64_t n, float scale, float offset) {
  if (scale == 0.0f) {
    double e = 0;
    for (int64_t k = 0; k < n; ++k) e += (double(w[k]) - offset) * (double(w[k]) - offset);
    return e;
  }
  std::vector<double> buffer;
  return TryInt4Scale(Int4Group(w, n, buffer), scale, offset).err;
}

std::string_view QuantKindName(QuantKind kind) {
  switch (kind) {
    case QuantKind::kInt8:
      return "int8";
    case QuantKind::kInt4:
      return "int4";
    case QuantKind::kInt4Asym:
      return "int4_asym";
  }
  return "?";
}

void QuantMatrix::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

QuantMatrix QuantMatrix::Quantize(const float* w, int64_t out, int64_t in, QuantKind kind,
                                  int group_size, ThreadPool* pool) {
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
    m.scale_offset_ = m.k_padded_ * kQuantBlock / 2;              // nibbles
    const int64_t tables = kind == QuantKind::kInt4Asym ? 2 : 1;  // scales (+ offsets)
    m.block_stride_ = RoundUp(m.scale_offset_ + tables * groups * kQuantBlock * 2, 64);
  }
  const int64_t total = nb * m.block_stride_;
  m.data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, RoundUp(total, 64))));
  if (m.data_ == nullptr) std::abort();
  if (kind == QuantKind::kInt8) {
    m.channel_scales_.assign(nb * kQuantBlock, 0.0f);
    m.channel_sums_.assign(nb * kQuantBlock, 0);
  }
  // Block b writes only its own bytes (and int8's per-channel entries), so
  // the blocks may run in any order on any threads.
  auto quantize_block = [&](int64_t b) {
    if (kind == QuantKind::kInt8) {
      QuantizeInt8Block(w, out, in, b, &m);
    } else {
      QuantizeInt4Block(w, out, in, b, &m);
    }
  };
  if (pool == nullptr || pool->num_threads() == 1 || nb == 1) {
    for (int64_t b = 0; b < nb; ++b) quantize_block(b);
  } else {
    // One block a chunk (int4: milliseconds of work against one atomic claim), so
    // a thread that loses its core to another process delays one block.
    const int chunks = static_cast<int>(std::min<int64_t>(nb, ThreadPool::kMaxChunks));
    pool->Run(chunks, [&](int c) {
      int64_t b0 = 0, b1 = 0;
      SplitRange(nb, chunks, c, &b0, &b1);
      for (int64_t b = b0; b < b1; ++b) quantize_block(b);
    });
  }
  return m;
}

void QuantMatrix::QuantizeInt8Block(const float* w, int64_t out, int64_t in, int64_t b,
                                    QuantMatrix* m) {
  uint8_t* blk = m->data_.get() + b * m->block_stride_;
  std::memset(blk, 0, m->block_stride_);  // padding: q = 0
  for (int64_t o = b * kQuantBlock; o < std::min(out, (b + 1) * kQuantBlock); ++o) {
    const float* wr = w + o * in;
    float amax = 0.0f;
    for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(wr[k]));
    // q = round(w / s), the textbook rounding (load time: no hurry).
    const float scale = amax / 127.0f;
    m->channel_scales_[o] = scale;
    uint8_t* lane = blk + (o % kQuantBlock) * 4;
    int32_t sum = 0;
    for (int64_t k = 0; k < in; ++k) {
      const int q = scale > 0.0f ? ClampQ(wr[k] / scale, 127) : 0;
      lane[(k / 4) * 64 + (k % 4)] = static_cast<uint8_t>(static_cast<int8_t>(q));
      sum += q;
    }
    m->channel_sums_[o] = sum;
  }
}

void QuantMatrix::QuantizeInt4Block(const float* w, int64_t out, int64_t in, int64_t b,
                                    QuantMatrix* m) {
  uint8_t* blk = m->data_.get() + b * m->block_stride_;
  // Padding: nibble 8 (q = 0), scale and offset 0.
  std::memset(blk, 0x88, m->scale_offset_);
  std::memset(blk + m->scale_offset_, 0, m->block_stride_ - m->scale_offset_);
  const int64_t g_size = m->group_;
  const bool asym = m->kind_ == QuantKind::kInt4Asym;
  for (int64_t o = b * kQuantBlock; o < std::min(out, (b + 1) * kQuantBlock); ++o) {
    const float* wr = w + o * in;
    const int lane = static_cast<int>(o % kQuantBlock);
    for (int64_t g = 0; g * g_size < in; ++g) {
      const int64_t k0 = g * g_size, k1 = std::min(in, k0 + g_size);
      const Int4Params p =
          asym ? Int4GroupScaleOffset(wr + k0, k1 - k0) : Int4GroupScale(wr + k0, k1 - k0);
      const float s = Fp16ToFloat(p.s16), o = Fp16ToFloat(p.o16);
      const float inv = s != 0.0f ? 1.0f / s : 0.0f;
      std::memcpy(blk + m->scale_offset_ + (g * kQuantBlock + lane) * 2, &p.s16, 2);
      if (asym) std::memcpy(blk + m->offset_offset() + (g * kQuantBlock + lane) * 2, &p.o16, 2);
      for (int64_t k = k0; k < k1; ++k) {
        const int q = s != 0.0f ? static_cast<int>(Int4LevelF(wr[k], inv, o)) : 0;
        const int64_t kk = k - k0;
        uint8_t& byte = blk[(k0 / 8 + kk / 8) * 64 + lane * 4 + (kk % 4)];
        const uint8_t u = static_cast<uint8_t>(q + 8);
        byte = (kk % 8) < 4 ? static_cast<uint8_t>((byte & 0xF0) | u)
                            : static_cast<uint8_t>((byte & 0x0F) | (u << 4));
      }
    }
  }
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
  const int64_t tables = kind == QuantKind::kInt4Asym ? 2 : 1;
  return nb * RoundUp(kp * kQuantBlock / 2 + tables * groups * kQuantBlock * 2, 64);
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

float QuantMatrix::OffsetAt(int64_t o, int64_t g) const {
  if (!has_offsets()) return 0.0f;
  uint16_t o16;
  std::memcpy(
      &o16, block(o / kQuantBlock) + offset_offset() + (g * kQuantBlock + o % kQuantBlock) * 2, 2);
  return Fp16ToFloat(o16);
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
          if (w.has_offsets()) {
            uint16_t o16;
            std::memcpy(&o16, blk + w.offset_offset() + (g * kQuantBlock + j) * 2, 2);
            facc = std::fma(a.sum_x[r * groups + g], Fp16ToFloat(o16), facc);
          }
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
  const bool int4 = w.is_int4();
  const int64_t kp = w.k_padded(), groups = w.num_groups();
  thread_local std::vector<int8_t> xh;
  thread_local std::vector<uint8_t> xhu, xl;
  thread_local std::vector<float> xscale, out;
  thread_local std::vector<int32_t> sum_h, sum_l;
  thread_local std::vector<float> sum_x;
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
  if (w.has_offsets()) {
    grow(sum_x, rows * groups);
    for (int64_t i = 0; i < rows * groups; ++i) sum_x[i] = internal::Combine(sum_h[i], sum_l[i]);
  }
  internal::QuantGemmArgs a;
  a.w = &w;
  a.xh = xh.data();
  a.xl = xl.data();
  a.xscale = xscale.data();
  a.sum_h = sum_h.data();
  a.sum_l = sum_l.data();
  a.sum_x = sum_x.data();
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
