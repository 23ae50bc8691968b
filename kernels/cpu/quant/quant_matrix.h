// QuantMatrix and QuantLinear: linear layers with int8 or int4 weights for
// the CPU forward pass, y = x W^T (+ y) as cpu::Linear (kernels/cpu/layers/gemm.h)
// computes with fp32 weights.
//
// Weights (quantized once, at load):
//   int8: symmetric per output channel: s_o = max_k |w_ok| / 127,
//         q_ok = round(w_ok / s_o) in [-127, 127].
//   int4: per group of `group_size` consecutive inputs of one output
//         channel, q = round(w / s_og) in [-8, 7] with an fp16 scale: of
//         a few scales around the one that maps the largest |w| to -8
//         (llama.cpp's q4_0), and two least-squares refits, the one with
//         the least squared error over the group; no zero point.
//   int4_asym: the same levels plus an fp16 offset per group, w ~ s_og q +
//         o_og (llama.cpp's q4_1, 5 bits a weight at group 32): the min/max
//         fit and its least-squares refits, or int4's scale with o = 0
//         where none does better.
// Activations are quantized per row on the fly to 15 bits,
// x_rk ~ t_r v_rk with t_r = max_k |x_rk| / 16256 and v_rk in [-16256,
// 16256], split into two bytes v = 128 h + l, h in [-127, 127] (signed),
// l in [0, 127]. So each product is two exact int8 x int8 sums, and the
// activations cost next to nothing in accuracy: on stories260K the kernels'
// logits stay within 0.002 of the same int8 weights multiplied in fp32,
// where the weights' own rounding moves them by 0.13; with 8-bit
// activations (one scale per row) the logits moved by up to 0.29 against
// fp32 instead of 0.19. Decode reads each weight once per token whatever
// the number of byte products, so the second one costs little there;
// prefill pays it in compute.
//   int8: y_ro = (128 float(sum_k h q) + float(sum_k l q)) * (s_o * t_r)
//   int4: y_ro = (sum over groups g, in order, fma(128 float(sum_g h q) +
//         float(sum_g l q), s_og, .)) * t_r
//   int4_asym: after each group's fma, fma(128 float(sum_g h) +
//         float(sum_g l), o_og, .)
// Every kernel (AVX-512 VNNI, AVX2, scalar) forms the same integers and then
// the same float operations, so all give the same bits, and a row's result
// depends neither on the batch nor on the thread split (the batch
// invariance gemm.h keeps for fp32).
//
// Layout (what a GEMV streams once per token): output channels in blocks of
// kQuantBlock = 16; inside a block, for every 4 consecutive inputs (a
// "quad"), the 16 channels' 4 values side by side, 64 bytes, which is one
// vpdpbusd operand. int8 stores q as int8 ([K/4][16][4] bytes per block).
// int4 stores q + 8 in a nibble, two quads per 64 bytes (low nibbles: the
// quad at k, high nibbles: the quad at k + 4), per group [G/8][64] bytes,
// then the block's fp16 scales [groups][16] (int4_asym: then its fp16
// offsets [groups][16]). K is padded with zeros to a
// multiple of 4 (int8) or of the group (int4): stories260K's w_down has
// K = 172, 5 groups of 32 and one of 12 real inputs plus 20 zeros.
//
// Unsigned x signed: vpdpbusd multiplies unsigned by signed bytes. int8
// feeds l as it is and h offset by 128 (h + 128 in [1, 255]), subtracting
// 128 * sum_k q_ok (kept per channel); int4 feeds the weights as unsigned
// nibbles (q + 8) and subtracts 8 * the group's sum of h (and of l) per
// row. AVX2's vpmaddubsw would saturate on 255 x 127 pairs, so int8 uses
// the sign trick there for h (|q| times h with q's sign: at most 2 x 127 x
// 127 per pair).
//
// Quantizing at load costs far more than a pass over the weights (int4
// tries about 15 scales a group, int4_asym about 40 (scale, offset) pairs):
// Quantize spreads the blocks over a ThreadPool when given one.
//
// Thread-safety: QuantMatrix is immutable after Quantize; QuantLinear is
// reentrant (per-thread scratch) and concurrent calls on disjoint outputs
// are safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace kvserve::cpu {

class ThreadPool;

enum class QuantKind : uint8_t { kInt8, kInt4, kInt4Asym };
std::string_view QuantKindName(QuantKind kind);

inline constexpr int kQuantBlock = 16;  // output channels per packed block
inline constexpr int kDefaultInt4Group = 32;

class QuantMatrix {
 public:
  QuantMatrix() = default;
  QuantMatrix(QuantMatrix&&) = default;
  QuantMatrix& operator=(QuantMatrix&&) = default;

  // w: [out][in] row-major fp32. group_size (int4 only) must be a positive
  // multiple of 8; int8 ignores it. With a pool, its threads quantize the
  // blocks of kQuantBlock output channels (each a function of its own rows
  // alone, written to its own bytes), so the result is the same bytes
  // whatever the pool; null runs on the caller.
  static QuantMatrix Quantize(const float* w, int64_t out, int64_t in, QuantKind kind,
                              int group_size = kDefaultInt4Group, ThreadPool* pool = nullptr);

  bool empty() const { return out_ == 0; }
  QuantKind kind() const { return kind_; }
  int64_t out() const { return out_; }
  int64_t in() const { return in_; }
  // in, padded: a multiple of 4 (int8) or of group_size() (int4).
  int64_t k_padded() const { return k_padded_; }
  // Inputs per scale: k_padded() for int8 (one scale per channel).
  int group_size() const { return group_; }
  int64_t num_groups() const { return k_padded_ / group_; }
  int64_t num_blocks() const { return (out_ + kQuantBlock - 1) / kQuantBlock; }
  // Bytes a pass over the matrix reads (packed weights, scales, sums).
  int64_t bytes() const;
  // bytes() of a matrix Quantize would make, without making it (plans).
  static int64_t BytesFor(int64_t out, int64_t in, QuantKind kind,
                          int group_size = kDefaultInt4Group);

  bool is_int4() const { return kind_ != QuantKind::kInt8; }
  bool has_offsets() const { return kind_ == QuantKind::kInt4Asym; }

  // The stored values, for tests: q in [-127, 127] (int8) or [-8, 7] (int4),
  // the scale of channel o's group g (int8: g = 0) and its offset (0 but
  // for int4_asym).
  int QuantAt(int64_t o, int64_t k) const;
  float ScaleAt(int64_t o, int64_t g) const;
  float OffsetAt(int64_t o, int64_t g) const;

  // For the kernels.
  const uint8_t* block(int64_t b) const { return data_.get() + b * block_stride_; }
  int64_t block_stride() const { return block_stride_; }
  // int4: byte offset of a block's fp16 scales [groups][16] from block(b);
  // int4_asym: its fp16 offsets [groups][16] follow them.
  int64_t scale_offset() const { return scale_offset_; }
  int64_t offset_offset() const { return scale_offset_ + num_groups() * kQuantBlock * 2; }
  const float* channel_scales() const { return channel_scales_.data(); }  // int8 [blocks * 16]
  const int32_t* channel_sums() const { return channel_sums_.data(); }    // int8 [blocks * 16]

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  // Block b of a matrix whose layout Quantize has set: its padding, its
  // channels' values and scales (and int8's channel_scales_ / sums_).
  static void QuantizeInt8Block(const float* w, int64_t out, int64_t in, int64_t b, QuantMatrix* m);
  static void QuantizeInt4Block(const float* w, int64_t out, int64_t in, int64_t b, QuantMatrix* m);
  QuantKind kind_ = QuantKind::kInt8;
  int64_t out_ = 0, in_ = 0, k_padded_ = 0;
  int group_ = 0;
  int64_t block_stride_ = 0, scale_offset_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> data_;
  std::vector<float> channel_scales_;
  std::vector<int32_t> channel_sums_;
};

// The kernels, for tests and benchmarks; kBest is the run-time choice:
// VNNI where the CPU has it, else AVX2, else scalar. KVSERVE_CPU_ISA=scalar
// forces scalar and =avx2 the AVX2 kernels, as for the fp32 kernels
// (cpu_features.h Avx512Allowed).
enum class QuantKernel { kBest, kVnni512, kAvx2, kScalar };
std::string_view QuantKernelName(QuantKernel kernel);
bool QuantKernelAvailable(QuantKernel kernel);
QuantKernel BestQuantKernel();

// y[r * ldy + (o - o_begin)] (+)= sum_k x[r * w.in() + k] * W[o][k] for o in
// [o_begin, o_end), r in [0, rows). x: [rows][w.in()] contiguous. Ranges
// that start or end inside a block compute the whole block (split on
// multiples of kQuantBlock to avoid it). A kernel the CPU lacks falls back
// to scalar.
void QuantLinear(const float* x, int64_t rows, const QuantMatrix& w, int64_t o_begin, int64_t o_end,
                 float* y, int64_t ldy, bool accumulate, QuantKernel kernel = QuantKernel::kBest);

// The squared error sum_k (w_k - s q_k - o)^2 of n weights of one int4
// group under scale s and offset o (q_k = round((w_k - o) / s) clamped to
// [-8, 7]; s = 0: all q = 0), as the quantizer compares its candidates.
// Exposed for tests.
double Int4GroupError(const float* w, int64_t n, float scale, float offset = 0.0f);

// Largest |v| of a quantized activation (127 * 128: h stays in [-127, 127]).
inline constexpr int kActMax = 16256;

// One row's activation quantization, as QuantLinear does it: hi, lo over
// [0, k_padded) (zeros past `in`) with x_k ~ *scale * (128 hi_k + lo_k);
// hi_sums[g] / lo_sums[g] the sums over group g of `group` inputs (both may
// be null). Exposed for tests.
void QuantizeActivationRow(const float* x, int64_t in, int64_t k_padded, int group, int8_t* hi,
                           uint8_t* lo, float* scale, int32_t* hi_sums, int32_t* lo_sums);

}  // namespace kvserve::cpu
