// The small CPU ops of the forward pass and the GEMM paths, against naive
// double-precision loops, at odd sizes; RoPE's two pairings agree under the
// HF row permutation; the thread pool runs every part exactly once.
#include "kernels/cpu/layers/ops.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/layers/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {
namespace {

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST_CASE("RmsNorm matches a double-precision reference per row", "[kernels]") {
  for (int dim : {1, 7, 64, 173}) {
    const int rows = 3;
    std::vector<float> x = RandomVec(rows * dim, dim), w = RandomVec(dim, dim + 1);
    std::vector<float> out(rows * dim);
    RmsNorm(x.data(), w.data(), out.data(), rows, dim, 1e-5f);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int j = 0; j < dim; ++j) ss += double(x[r * dim + j]) * x[r * dim + j];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int j = 0; j < dim; ++j) {
        REQUIRE(out[r * dim + j] == Approx(w[j] * x[r * dim + j] * inv).epsilon(1e-5).margin(1e-6));
      }
    }
    SECTION("in place gives the same bits") {
      std::vector<float> y = x;
      RmsNorm(y.data(), w.data(), y.data(), rows, dim, 1e-5f);
      REQUIRE(y == out);
    }
  }
}

TEST_CASE("RopeTable holds cos and sin of pos * theta^(-2j/head_dim)", "[kernels]") {
  const int head_dim = 8;
  RopeTable t(512, head_dim, 10000.0f);
  REQUIRE(t.max_positions() == 512);
  REQUIRE(t.half_dim() == 4);
  for (int j = 0; j < 4; ++j) {
    REQUIRE(t.cos(0)[j] == 1.0f);
    REQUIRE(t.sin(0)[j] == 0.0f);
  }
  for (int pos : {1, 17, 511}) {
    for (int j = 0; j < 4; ++j) {
      const double angle = pos * std::pow(10000.0, -2.0 * j / head_dim);
      REQUIRE(t.cos(pos)[j] == Approx(std::cos(angle)).margin(2e-4));
      REQUIRE(t.sin(pos)[j] == Approx(std::sin(angle)).margin(2e-4));
    }
  }
}

TEST_CASE("RoPE rotates pairs, and neox on the HF-permuted vector equals interleaved",
          "[kernels]") {
  const int head_dim = 8, heads = 3, half = head_dim / 2;
  RopeTable t(64, head_dim, 10000.0f);
  SECTION("interleaved rotates (2j, 2j+1) by the table's angle") {
    std::vector<float> v = RandomVec(heads * head_dim, 1);
    std::vector<float> orig = v;
    ApplyRope(v.data(), heads, head_dim, t.cos(5), t.sin(5), /*interleaved=*/true);
    for (int h = 0; h < heads; ++h) {
      for (int j = 0; j < half; ++j) {
        const float a = orig[h * head_dim + 2 * j], b = orig[h * head_dim + 2 * j + 1];
        REQUIRE(v[h * head_dim + 2 * j] == a * t.cos(5)[j] - b * t.sin(5)[j]);
        REQUIRE(v[h * head_dim + 2 * j + 1] == a * t.sin(5)[j] + b * t.cos(5)[j]);
      }
    }
  }
  SECTION("position 0 is the identity") {
    std::vector<float> v = RandomVec(heads * head_dim, 2);
    std::vector<float> orig = v;
    ApplyRope(v.data(), heads, head_dim, t.cos(0), t.sin(0), false);
    REQUIRE(v == orig);
  }
  SECTION("the HF permutation (evens then odds per head) maps one onto the other") {
    for (int pos : {1, 9, 63}) {
      std::vector<float> inter = RandomVec(heads * head_dim, 100 + pos);
      std::vector<float> neox(inter.size());
      for (int h = 0; h < heads; ++h) {
        for (int j = 0; j < half; ++j) {
          neox[h * head_dim + j] = inter[h * head_dim + 2 * j];
          neox[h * head_dim + j + half] = inter[h * head_dim + 2 * j + 1];
        }
      }
      ApplyRope(inter.data(), heads, head_dim, t.cos(pos), t.sin(pos), true);
      ApplyRope(neox.data(), heads, head_dim, t.cos(pos), t.sin(pos), false);
      for (int h = 0; h < heads; ++h) {
        for (int j = 0; j < half; ++j) {
          REQUIRE(neox[h * head_dim + j] == inter[h * head_dim + 2 * j]);
          REQUIRE(neox[h * head_dim + j + half] == inter[h * head_dim + 2 * j + 1]);
        }
      }
    }
  }
}

TEST_CASE("SiluMul computes silu(gate) * up", "[kernels]") {
  for (int n : {1, 7, 8, 172, 173}) {
    std::vector<float> gate = RandomVec(n, n, 8.0f), up = RandomVec(n, n + 7, 2.0f);
    std::vector<float> out = gate;
    SiluMul(out.data(), up.data(), n);
    for (int i = 0; i < n; ++i) {
      const double g = gate[i];
      REQUIRE(out[i] == Approx(g / (1.0 + std::exp(-g)) * up[i]).epsilon(1e-5).margin(1e-6));
    }
    SECTION("an element's result does not depend on its offset in the array") {
      for (int skip : {1, 3, 5}) {
        if (skip >= n) continue;
        std::vector<float> part(gate.begin() + skip, gate.end());
        SiluMul(part.data(), up.data() + skip, n - skip);
        for (int i = skip; i < n; ++i) REQUIRE(part[i - skip] == out[i]);
      }
    }
  }
  SECTION("saturates without NaN or infinity") {
    std::vector<float> gate = {-1000.0f, -100.0f, -88.0f, 0.0f,  88.0f,
                               100.0f,   1000.0f, 20.0f,  -20.0f};
    std::vector<float> up(gate.size(), 1.0f);
    std::vector<float> out = gate;
    SiluMul(out.data(), up.data(), static_cast<int64_t>(gate.size()));
    for (size_t i = 0; i < gate.size(); ++i) {
      REQUIRE(std::isfinite(out[i]));
      if (gate[i] >= 20.0f) REQUIRE(out[i] == Approx(gate[i]));
      if (gate[i] <= -88.0f) REQUIRE(std::fabs(out[i]) < 1e-30f);
    }
  }
}

TEST_CASE("Embedding copies table rows", "[kernels]") {
  std::vector<float> table = RandomVec(10 * 3, 5);
  const int32_t ids[] = {9, 0, 4, 4};
  std::vector<float> out(4 * 3);
  Embedding(table.data(), ids, 4, 3, out.data());
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 3; ++j) REQUIRE(out[t * 3 + j] == table[ids[t] * 3 + j]);
  }
}

void NaiveLinear(const std::vector<float>& x, int rows, int in, const std::vector<float>& w,
                 int out, std::vector<double>* y) {
  y->assign(size_t(rows) * out, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int k = 0; k < in; ++k) s += double(x[r * in + k]) * w[o * in + k];
      (*y)[r * out + o] = s;
    }
  }
}

TEST_CASE("Linear and every MatVec kernel match naive loops at odd sizes, batch-invariantly",
          "[kernels]") {
  for (int rows : {1, 2, 5, 17}) {
    for (int in : {1, 7, 8, 64, 173}) {
      for (int out : {1, 3, 4, 5, 64, 513}) {
        INFO("rows " << rows << " in " << in << " out " << out);
        std::vector<float> x = RandomVec(rows * in, rows * 1000 + in);
        std::vector<float> w = RandomVec(out * in, in * 1000 + out);
        std::vector<double> want;
        NaiveLinear(x, rows, in, w, out, &want);
        const double tol = 1e-5 * std::sqrt(double(in)) + 1e-6;

        // Overwrite, into a strided output whose padding must stay untouched.
        const int ldy = out + 3;
        std::vector<float> y(size_t(rows) * ldy, 42.0f);
        Linear(x.data(), rows, in, w.data(), out, y.data(), ldy, false);
        for (int r = 0; r < rows; ++r) {
          for (int o = 0; o < out; ++o)
            REQUIRE(y[r * ldy + o] == Approx(want[r * out + o]).margin(tol));
          for (int o = out; o < ldy; ++o) REQUIRE(y[r * ldy + o] == 42.0f);
        }
        // Accumulate adds onto what is there.
        Linear(x.data(), rows, in, w.data(), out, y.data(), ldy, true);
        for (int r = 0; r < rows; ++r) {
          for (int o = 0; o < out; ++o) {
            REQUIRE(y[r * ldy + o] == Approx(2 * want[r * out + o]).margin(2 * tol));
          }
        }
        // Batch invariance: each row alone gives the same bits as in the batch.
        std::vector<float> batched(size_t(rows) * out);
        Linear(x.data(), rows, in, w.data(), out, batched.data(), out, false);
        for (int r = 0; r < rows; ++r) {
          std::vector<float> alone(out);
          Linear(x.data() + r * in, 1, in, w.data(), out, alone.data(), out, false);
          for (int o = 0; o < out; ++o) REQUIRE(alone[o] == batched[r * out + o]);
        }
        if (rows == 1) {
          for (MatVecKernel k : {MatVecKernel::kAvx2, MatVecKernel::kScalar}) {
            std::vector<float> v(out, 1.0f);
            MatVec(w.data(), x.data(), v.data(), out, in, false, k);
            for (int o = 0; o < out; ++o) REQUIRE(v[o] == Approx(want[o]).margin(tol));
            MatVec(w.data(), x.data(), v.data(), out, in, true, k);
            for (int o = 0; o < out; ++o) REQUIRE(v[o] == Approx(2 * want[o]).margin(2 * tol));
          }
        }
      }
    }
  }
}

TEST_CASE("The AVX-512 and AVX2 Linear kernels give identical bits for any rows and split",
          "[kernels]") {
  if (!LinearKernelAvailable(LinearKernel::kAvx512) ||
      !LinearKernelAvailable(LinearKernel::kAvx2)) {
    WARN("skipped: this CPU lacks AVX-512 (F, DQ, VL) or AVX2");
    return;
  }
  // Odd k tails, odd row counts (a padded pair), every tile remainder of 6
  // rows and of 8 outputs, and W blocks of more than one L2 block (in 2048).
  for (int rows : {1, 2, 3, 5, 6, 7, 13, 40}) {
    for (int in : {1, 7, 8, 9, 64, 173, 2048}) {
      for (int out : {1, 5, 8, 17, 260}) {
        INFO("rows " << rows << " in " << in << " out " << out);
        std::vector<float> x = RandomVec(rows * in, rows * 1000 + in);
        std::vector<float> w = RandomVec(out * in, in * 1000 + out);
        const int ldy = out + 2;
        for (bool accumulate : {false, true}) {
          std::vector<float> y2 = RandomVec(rows * ldy, 7), y5 = y2;
          Linear(x.data(), rows, in, w.data(), out, y2.data(), ldy, accumulate,
                 LinearKernel::kAvx2);
          Linear(x.data(), rows, in, w.data(), out, y5.data(), ldy, accumulate,
                 LinearKernel::kAvx512);
          REQUIRE(std::memcmp(y2.data(), y5.data(), y2.size() * sizeof(float)) == 0);
          // Split over output features at the granule, as the forward pass does.
          std::vector<float> ys = RandomVec(rows * ldy, 7);
          for (int o0 = 0; o0 < out; o0 += 3 * kOutputGranule) {
            const int o1 = std::min<int>(out, o0 + 3 * kOutputGranule);
            Linear(x.data(), rows, in, w.data() + int64_t{o0} * in, o1 - o0, ys.data() + o0, ldy,
                   accumulate, LinearKernel::kAvx512);
          }
          REQUIRE(std::memcmp(y2.data(), ys.data(), y2.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("ThreadPool runs each chunk exactly once per Run", "[kernels]") {
  // Few iterations: the machine may have fewer cores than threads here, and a
  // descheduled worker costs a time slice per Run.
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    REQUIRE(pool.num_threads() == threads);
    for (int chunks : {0, 1, 2, 3, 7, 64}) {
      std::vector<std::atomic<int>> hits(chunks);
      for (int iter = 0; iter < 40; ++iter) {
        pool.Run(chunks, [&](int c) { hits[c].fetch_add(1); });
      }
      for (int c = 0; c < chunks; ++c) REQUIRE(hits[c].load() == 40);
    }
  }
}

TEST_CASE("SplitRange covers 0 .. n with contiguous ranges", "[kernels]") {
  for (int64_t n : {0, 1, 5, 64}) {
    for (int parts : {1, 2, 3}) {
      int64_t prev_end = 0;
      for (int p = 0; p < parts; ++p) {
        int64_t b, e;
        SplitRange(n, parts, p, &b, &e);
        REQUIRE(b == prev_end);
        REQUIRE(e >= b);
        prev_end = e;
      }
      REQUIRE(prev_end == n);
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
