#include "kernels/cpu/quant/quant_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

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

}  // namespace

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
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      m.channel_scales_[o] = amax / 127.0f;
      uint8_t* blk = m.data_.get() + (o / kQuantBlock) * m.block_stride_ + (o % kQuantBlock) * 4;
      int32_t sum = 0;
      for (int64_t k = 0; k < in; ++k) {
        const int q = ClampQ(wr[k] * inv, 127);
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
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(wr[k]));
      const uint16_t s16 = FloatToFp16(std::min(amax / 7.0f, kFp16Max));
      const float s = Fp16ToFloat(s16);
      std::memcpy(blk + m.scale_offset_ + (g * kQuantBlock + lane) * 2, &s16, 2);
      for (int64_t k = k0; k < k1; ++k) {
        const int q = s > 0.0f ? ClampQ(wr[k] / s, 7) : 0;
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

void QuantizeActivationRow(const float* x, int64_t in, int64_t k_padded, int group, int8_t* q,
                           float* scale, int32_t* group_sums) {
  float amax = 0.0f;
  for (int64_t k = 0; k < in; ++k) {
    const float a = std::fabs(x[k]);
    amax = a > amax ? a : amax;
  }
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  for (int64_t k = 0; k < in; ++k) q[k] = static_cast<int8_t>(ClampQ(x[k] * inv, 127));
  std::memset(q + in, 0, k_padded - in);
  if (group_sums == nullptr) return;
  for (int64_t g = 0; g * group < k_padded; ++g) {
    int32_t s = 0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) s += q[k];
    group_sums[g] = s;
  }
}

namespace internal {

void Q8Scalar(const QuantGemmArgs& a) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded();
  for (int64_t r = 0; r < a.rows; ++r) {
    const int8_t* xr = a.xq + r * kp;
    for (int64_t b = a.b_begin; b < a.b_end; ++b) {
      const int8_t* blk = reinterpret_cast<const int8_t*>(w.block(b));
      for (int j = 0; j < kQuantBlock; ++j) {
        int32_t acc = 0;
        for (int64_t k = 0; k < kp; ++k) acc += xr[k] * blk[(k / 4) * 64 + j * 4 + (k % 4)];
        const float scale = w.channel_scales()[b * kQuantBlock + j] * a.xscale[r];
        a.out[r * a.ldo + (b - a.b_begin) * kQuantBlock + j] = static_cast<float>(acc) * scale;
      }
    }
  }
}

void Q4Scalar(const QuantGemmArgs& a) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), g_size = w.group_size();
  for (int64_t r = 0; r < a.rows; ++r) {
    const int8_t* xr = a.xq + r * kp;
    for (int64_t b = a.b_begin; b < a.b_end; ++b) {
      const uint8_t* blk = w.block(b);
      for (int j = 0; j < kQuantBlock; ++j) {
        float facc = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t acc = -8 * a.xsum[r * groups + g];
          for (int64_t k = g * g_size; k < (g + 1) * g_size; ++k) {
            const uint8_t byte = blk[(k / 8) * 64 + j * 4 + (k % 4)];
            acc += xr[k] * ((k % 8) < 4 ? (byte & 0x0F) : (byte >> 4));
          }
          uint16_t s16;
          std::memcpy(&s16, blk + w.scale_offset() + (g * kQuantBlock + j) * 2, 2);
          facc = std::fma(static_cast<float>(acc), Fp16ToFloat(s16), facc);
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
  return CpuHasAvx512Vnni() ? QuantKernel::kVnni512 : QuantKernel::kAvx2;
}

void QuantLinear(const float* x, int64_t rows, const QuantMatrix& w, int64_t o_begin, int64_t o_end,
                 float* y, int64_t ldy, bool accumulate, QuantKernel kernel) {
  o_end = std::min(o_end, w.out());
  if (rows <= 0 || o_end <= o_begin || w.empty()) return;
  if (kernel == QuantKernel::kBest) kernel = BestQuantKernel();
  if (!QuantKernelAvailable(kernel)) kernel = QuantKernel::kScalar;
  const bool int4 = w.kind() == QuantKind::kInt4;
  const int64_t kp = w.k_padded(), groups = w.num_groups();
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<uint8_t> xu;
  thread_local std::vector<float> xscale, out;
  thread_local std::vector<int32_t> xsum;
  xq.resize(std::max<size_t>(xq.size(), rows * kp));
  xscale.resize(std::max<size_t>(xscale.size(), rows));
  if (int4) xsum.resize(std::max<size_t>(xsum.size(), rows * groups));
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeActivationRow(x + r * w.in(), w.in(), kp, w.group_size(), xq.data() + r * kp,
                          &xscale[r], int4 ? xsum.data() + r * groups : nullptr);
  }
  internal::QuantGemmArgs a;
  a.w = &w;
  a.xq = xq.data();
  a.xscale = xscale.data();
  a.xsum = xsum.data();
  a.rows = rows;
  a.b_begin = o_begin / kQuantBlock;
  a.b_end = (o_end + kQuantBlock - 1) / kQuantBlock;
  a.ldo = (a.b_end - a.b_begin) * kQuantBlock;
  out.resize(std::max<size_t>(out.size(), rows * a.ldo));
  a.out = out.data();
  if (!int4 && kernel == QuantKernel::kVnni512) {
    xu.resize(std::max<size_t>(xu.size(), rows * kp));
    for (int64_t i = 0; i < rows * kp; ++i) xu[i] = static_cast<uint8_t>(xq[i]) ^ 0x80;
    a.xu = xu.data();
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
