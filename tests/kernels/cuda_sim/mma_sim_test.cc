// The simulated tensor-core and async-copy operations of kernels/cuda/device/mma.cuh
// against a scalar reference: each lane builds its fragments from whole
// matrices by the PTX ISA's tables (written here independently of the
// simulator's inverse mapping), so a wrong table on either side shows up as
// a wrong product; ldmatrix.trans lane by lane; cp.async landing only at the
// wait that retires its group, zero fill, and the exit check.
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim.h"  // first: the shims the kernel source needs
#include "kernels/cuda/device/mma.cuh"
// clang-format on

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/kv/kv_quant.h"

namespace kvserve::cuda {
namespace {

// The bits of a value exact in fp16 and bf16.
uint16_t HalfOf(float x, bool bf16) {
  if (bf16) return cpu::FloatToBf16(x);
  return cpu::FloatToFp16(x);
}

struct MmaArgs {
  const uint16_t* a;  // [16][16] row-major
  const uint16_t* b;  // [16][8] (k, n) row-major
  const float* c;     // [16][8]
  float* d;           // [warps][16][8]
  bool bf16;
};

uint32_t Pack(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }

void MmaKernel(MmaArgs p) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  float* out = p.d + static_cast<int>(threadIdx.x) / 32 * 128;  // each warp its own tile
  const auto A = [&](int r, int c) { return p.a[r * 16 + c]; };
  const auto B = [&](int k, int n) { return p.b[k * 8 + n]; };
  const uint32_t a[4] = {
      Pack(A(g, 2 * t), A(g, 2 * t + 1)), Pack(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
      Pack(A(g, 2 * t + 8), A(g, 2 * t + 9)), Pack(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9))};
  const uint32_t b[2] = {Pack(B(2 * t, g), B(2 * t + 1, g)),
                         Pack(B(2 * t + 8, g), B(2 * t + 9, g))};
  float d[4] = {p.c[g * 8 + 2 * t], p.c[g * 8 + 2 * t + 1], p.c[(g + 8) * 8 + 2 * t],
                p.c[(g + 8) * 8 + 2 * t + 1]};
  if (p.bf16) {
    mma::MmaBf16(d, a, b);
  } else {
    mma::MmaF16(d, a, b);
  }
  out[g * 8 + 2 * t] = d[0];
  out[g * 8 + 2 * t + 1] = d[1];
  out[(g + 8) * 8 + 2 * t] = d[2];
  out[(g + 8) * 8 + 2 * t + 1] = d[3];
}

TEST_CASE("simulated mma m16n8k16 is C + A * B with the PTX fragment layouts",
          "[kernels][cuda_sim]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-64, 64);
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp16"));
    // Values k / 8 (exact in both types); every product and sum is exact in
    // fp32, so the result must equal the double reference bit for bit.
    std::vector<float> af(256), bf(128), c(128);
    std::vector<uint16_t> a(256), b(128);
    for (int i = 0; i < 256; ++i) a[i] = HalfOf(af[i] = small(rng) / 8.0f, bf16);
    for (int i = 0; i < 128; ++i) b[i] = HalfOf(bf[i] = small(rng) / 8.0f, bf16);
    for (float& x : c) x = static_cast<float>(small(rng));
    // Two warps: the second runs the same tile into its own output (lanes
    // 32..63 must not read the first warp's registers).
    for (int warps : {1, 2}) {
      std::vector<float> d(128 * warps, -1.0f);
      cuda_sim::Launch(MmaKernel, dim3(1), 32 * warps, nullptr, 0,
                       MmaArgs{a.data(), b.data(), c.data(), d.data(), bf16});
      for (int w = 0; w < warps; ++w) {
        for (int r = 0; r < 16; ++r) {
          for (int n = 0; n < 8; ++n) {
            double want = c[r * 8 + n];
            for (int k = 0; k < 16; ++k) want += double(af[r * 16 + k]) * bf[k * 8 + n];
            INFO("row " << r << " col " << n << " warp " << w << " of " << warps);
            REQUIRE(d[w * 128 + r * 8 + n] == static_cast<float>(want));
          }
        }
      }
    }
  }
}

struct LdmArgs {
  uint32_t* out;  // [32 lanes][4]
};

void LdmatrixKernel(LdmArgs p) {
  auto* smem = static_cast<uint16_t*>(::cuda_sim::g_dynamic_shared);  // 4 matrices [8][8]
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = lane; e < 256; e += 32) smem[e] = static_cast<uint16_t>(e * 3 + 1);
  __syncthreads();
  // Lane l names row l % 8 of matrix l / 8.
  uint32_t r[4];
  mma::LdmatrixX4Trans(r, smem + (lane / 8) * 64 + (lane % 8) * 8);
  for (int j = 0; j < 4; ++j) p.out[lane * 4 + j] = r[j];
}

TEST_CASE("simulated ldmatrix x4 trans hands lane l elements [2(l%4)][l/4] and [2(l%4)+1][l/4]",
          "[kernels][cuda_sim]") {
  alignas(16) uint16_t smem[256];
  std::vector<uint32_t> out(128, 0);
  cuda_sim::Launch(LdmatrixKernel, dim3(1), 32, smem, sizeof(smem), LdmArgs{out.data()});
  const auto value = [](int j, int row, int col) {
    return uint32_t((j * 64 + row * 8 + col) * 3 + 1);
  };
  for (int l = 0; l < 32; ++l) {
    for (int j = 0; j < 4; ++j) {
      INFO("lane " << l << " matrix " << j);
      REQUIRE((out[l * 4 + j] & 0xffffu) == value(j, 2 * (l % 4), l / 4));
      REQUIRE((out[l * 4 + j] >> 16) == value(j, 2 * (l % 4) + 1, l / 4));
    }
  }
}

struct CopyArgs {
  const uint32_t* src;  // [64]
  uint32_t* seen;       // [64 threads][3]: before the wait, after wait<1>, after wait<0>
};

void CopyKernel(CopyArgs p) {
  auto* smem = static_cast<uint32_t*>(::cuda_sim::g_dynamic_shared);  // [2][64] words
  const int t = static_cast<int>(threadIdx.x);
  // Group 0: word t of the source, through a 16-byte copy of words
  // 4(t/4)..4(t/4)+3 by every fourth thread, zero-filled for t/4 odd.
  if (t % 4 == 0) mma::CpAsync16(smem + t, p.src + t, (t / 4) % 2 == 0 ? 16 : 0);
  mma::CpAsyncCommit();
  // Group 1: a 4-byte copy into the second row.
  mma::CpAsync4(smem + 64 + t, p.src + t, 4);
  mma::CpAsyncCommit();
  p.seen[t * 3] = smem[64 + t];  // not landed: poison
  mma::CpAsyncWait<1>();
  p.seen[t * 3 + 1] = smem[64 + t];  // group 1 still pending
  mma::CpAsyncWait<0>();
  p.seen[t * 3 + 2] = smem[64 + t];
  __syncthreads();
  // Group 0 of every thread has landed and the barrier made it visible.
  p.seen[t * 3] = p.seen[t * 3] == 0xffffffffu && p.seen[t * 3 + 1] == 0xffffffffu ? smem[t] : 1u;
}

TEST_CASE("simulated cp.async lands at the wait that retires its group, zero-filling the rest",
          "[kernels][cuda_sim]") {
  std::vector<uint32_t> src(64), seen(192, 7);
  for (int i = 0; i < 64; ++i) src[i] = 1000u + i;
  alignas(16) uint32_t smem[128];
  cuda_sim::Launch(CopyKernel, dim3(1), 64, smem, sizeof(smem), CopyArgs{src.data(), seen.data()});
  for (int t = 0; t < 64; ++t) {
    INFO("thread " << t);
    REQUIRE(seen[t * 3] == ((t / 4) % 2 == 0 ? 1000u + t : 0u));
    REQUIRE(seen[t * 3 + 2] == 1000u + t);
  }
}

}  // namespace
}  // namespace kvserve::cuda
