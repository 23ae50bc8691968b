// QuantMatrix::Quantize on a ThreadPool gives the single-threaded bytes:
// every dtype (int8, int4, int4_asym) and group size, on shapes whose rows
// end inside a block of 16 channels and whose inputs are no multiple of 4,
// 8, 16 or 32 (padded groups), with all-zero and constant channels mixed
// in. The packed blocks (values, padding, fp16 scales and offsets) and
// int8's per-channel scales and sums are compared byte for byte.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/quant/quant_matrix.h"
#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {
namespace {

std::vector<float> RandomMatrix(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 0.05f);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> w(out * in);
  for (int64_t o = 0; o < out; ++o) {
    float* row = w.data() + o * in;
    if (o % 7 == 3) continue;  // an all-zero channel
    if (o % 11 == 5) {         // a constant channel: max == min in every group
      for (int64_t k = 0; k < in; ++k) row[k] = 0.25f;
      continue;
    }
    for (int64_t k = 0; k < in; ++k) row[k] = o % 2 ? gauss(rng) : 0.02f * heavy(rng);
  }
  return w;
}

// Byte for byte, including the padding of the last block and group.
void RequireSameBytes(const QuantMatrix& a, const QuantMatrix& b) {
  REQUIRE(a.kind() == b.kind());
  REQUIRE(a.out() == b.out());
  REQUIRE(a.in() == b.in());
  REQUIRE(a.k_padded() == b.k_padded());
  REQUIRE(a.group_size() == b.group_size());
  REQUIRE(a.block_stride() == b.block_stride());
  REQUIRE(a.bytes() == b.bytes());
  const int64_t packed = a.num_blocks() * a.block_stride();
  REQUIRE(std::memcmp(a.block(0), b.block(0), packed) == 0);
  if (a.kind() == QuantKind::kInt8) {
    const size_t n = a.num_blocks() * kQuantBlock;
    REQUIRE(std::memcmp(a.channel_scales(), b.channel_scales(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(a.channel_sums(), b.channel_sums(), n * sizeof(int32_t)) == 0);
  }
}

TEST_CASE("Quantize on 4 threads gives the bytes of 1", "[kernels]") {
  ThreadPool pool1(1), pool3(3), pool4(4);
  struct Shape {
    int64_t out, in;
  };
  // out: one partial block, exactly one, one and a bit, several with a
  // partial last; in: 1, under a quad, odd, no multiple of 8, 16 or 32
  // (172: stories260K's w_down), and several groups of 128.
  const Shape shapes[] = {{1, 1},    {5, 3},    {16, 7},  {17, 13},  {37, 45},
                          {50, 100}, {33, 172}, {64, 64}, {83, 300}, {29, 257}};
  const struct {
    QuantKind kind;
    int group;
  } formats[] = {{QuantKind::kInt8, kDefaultInt4Group},
                 {QuantKind::kInt4, 8},
                 {QuantKind::kInt4, 16},
                 {QuantKind::kInt4, 32},
                 {QuantKind::kInt4, 128},
                 {QuantKind::kInt4Asym, 8},
                 {QuantKind::kInt4Asym, 32},
                 {QuantKind::kInt4Asym, 64},
                 {QuantKind::kInt4Asym, 128}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    const std::vector<float> w = RandomMatrix(s.out, s.in, seed++);
    for (const auto& f : formats) {
      CAPTURE(s.out, s.in, QuantKindName(f.kind), f.group);
      const QuantMatrix inline_run = QuantMatrix::Quantize(w.data(), s.out, s.in, f.kind, f.group);
      const QuantMatrix one = QuantMatrix::Quantize(w.data(), s.out, s.in, f.kind, f.group, &pool1);
      const QuantMatrix three =
          QuantMatrix::Quantize(w.data(), s.out, s.in, f.kind, f.group, &pool3);
      const QuantMatrix four =
          QuantMatrix::Quantize(w.data(), s.out, s.in, f.kind, f.group, &pool4);
      RequireSameBytes(inline_run, one);
      RequireSameBytes(one, three);
      RequireSameBytes(one, four);
    }
  }
}

TEST_CASE("Quantize reuses a pool across matrices", "[kernels]") {
  // A pool's threads keep their scratch between jobs: a long matrix after a
  // short one, and the same matrix twice, give the same bytes.
  ThreadPool pool(4);
  const std::vector<float> small = RandomMatrix(20, 40, 7), large = RandomMatrix(70, 200, 8);
  for (QuantKind kind : {QuantKind::kInt8, QuantKind::kInt4, QuantKind::kInt4Asym}) {
    CAPTURE(QuantKindName(kind));
    const QuantMatrix ref = QuantMatrix::Quantize(large.data(), 70, 200, kind, 32);
    (void)QuantMatrix::Quantize(small.data(), 20, 40, kind, 32, &pool);
    RequireSameBytes(ref, QuantMatrix::Quantize(large.data(), 70, 200, kind, 32, &pool));
    RequireSameBytes(ref, QuantMatrix::Quantize(large.data(), 70, 200, kind, 32, &pool));
  }
}

}  // namespace
}  // namespace kvserve::cpu
