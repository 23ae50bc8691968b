// The non-attention CUDA kernels' source (KV write, block copy, RoPE,
// SwiGLU, embedding), run on the CPU by cuda_sim (cuda_sim_more.h adds the
// shuffles, atomics and static shared memory they use), against the CPU
// kernels: the device code's warp teams, indexing, masking and rounding are
// checked in make test without a GPU. Small cases; the [gpu] tests sweep.
//
// The launch arguments are filled as each launcher (.cu) fills them (its
// validation and defaults are covered by the [gpu] tests).
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim_more.h"  // first: the shims the kernel source needs
#include "kernels/cuda/kv/copy_blocks_kernel.cuh"
#include "kernels/cuda/layers/embedding_kernel.cuh"
#include "kernels/cuda/kv/kv_write_kernel.cuh"
#include "kernels/cuda/layers/rope_kernel.cuh"
#include "kernels/cuda/layers/swiglu_kernel.cuh"
// clang-format on

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cache/format/kv_format.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/layers/ops.h"

namespace kvserve::cuda {
namespace {

// A launch of a kernel with several arguments: body() runs as each thread.
template <typename F>
void LaunchBody(dim3 grid, int threads, F&& body) {
  cuda_sim::g_grid_dim = grid;
  cuda_sim::g_block_dim = dim3(threads, 1, 1);
  for (unsigned y = 0; y < grid.y; ++y) {
    for (unsigned x = 0; x < grid.x; ++x) cuda_sim::RunBlock({x, y, 0}, threads, body);
  }
}

TEST_CASE("simulated KV write writes cpu::WriteKv's bytes", "[cuda_sim]") {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int cases = 0;
  for (KvDtype dtype : kAllKvDtypes) {
    for (int head_dim : {8, 64, 128}) {
      for (int block_size : {1, 16}) {
        INFO(KvDtypeName(dtype) << " head_dim " << head_dim << " block_size " << block_size);
        const int hkv = 2, tokens = 5, group = head_dim == 128 ? 32 : 64;
        const absl::StatusOr<KvFormat> format =
            KvFormat::Create(dtype, hkv, head_dim, block_size, group);
        REQUIRE(format.ok());
        const int32_t num_blocks = (tokens + block_size - 1) / block_size + 2;
        std::vector<int64_t> slots(static_cast<size_t>(num_blocks) * block_size);
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(tokens);
        slots[2] = -1;
        std::vector<float> k(tokens * hkv * head_dim), v(k.size());
        for (size_t i = 0; i < k.size(); ++i) {
          const float mag = (i / head_dim) % 3 == 0 ? 0.01f : 3.0f;
          k[i] = mag * normal(rng);
          v[i] = mag * (normal(rng) + 1.0f);
        }
        std::fill(k.begin() + head_dim, k.begin() + 2 * head_dim, 0.0f);  // an all-zero row
        const int64_t pool_bytes = num_blocks * format->block_bytes();
        std::vector<uint8_t> want(pool_bytes);
        for (uint8_t& b : want) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> got = want;

        cpu::KvWriteParams cp;
        cp.k = k.data();
        cp.v = v.data();
        cp.slot_mapping = slots.data();
        cp.num_tokens = tokens;
        cp.kv = PagedKvView{want.data(), num_blocks, format->layout()};
        cpu::WriteKv(cp);

        KvWriteParams p;
        p.k = k.data();
        p.v = v.data();
        p.k_stride = p.v_stride = hkv * head_dim;
        p.slot_mapping = slots.data();
        p.num_tokens = tokens;
        p.kv = PagedKvView{got.data(), num_blocks, format->layout()};
        p.dtype = ActDtype::kFp32;
        const int64_t blocks =
            (int64_t{tokens} * hkv * 2 + kv_write_detail::kWarps - 1) / kv_write_detail::kWarps;
        cuda_sim::Launch(kv_write_detail::KvWriteKernel<float>, dim3(blocks),
                         kv_write_detail::kThreads, nullptr, 0, p);
        REQUIRE(got == want);
        ++cases;
      }
    }
  }
  REQUIRE(cases == 42);
}

TEST_CASE("simulated block copy copies every layer of the listed blocks", "[cuda_sim]") {
  std::mt19937_64 rng(2);
  const int layers = 3;
  const int32_t src_blocks = 6, dst_blocks = 5;
  const int64_t block_bytes = 96;
  std::vector<uint8_t> src(layers * src_blocks * block_bytes),
      dst(layers * dst_blocks * block_bytes);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (uint8_t& b : dst) b = static_cast<uint8_t>(rng());
  // {src, dst} pairs; the last names a block outside the destination pool.
  const std::vector<int32_t> copies = {5, 0, 1, 3, 5, 4, 2, 7};
  std::vector<uint8_t> want = dst;
  for (int c = 0; c < 3; ++c) {
    for (int l = 0; l < layers; ++l) {
      std::memcpy(&want[(l * dst_blocks + copies[2 * c + 1]) * block_bytes],
                  &src[(l * src_blocks + copies[2 * c]) * block_bytes], block_bytes);
    }
  }
  CopyBlocksParams p{src.data(), dst.data(),  src_blocks,    dst_blocks,
                     layers,     block_bytes, copies.data(), 4};
  cuda_sim::Launch(copy_blocks_detail::CopyBlocksKernel, dim3(4, layers),
                   copy_blocks_detail::kThreads, nullptr, 0, p);
  REQUIRE(dst == want);
}

TEST_CASE("simulated RoPE equals cpu::ApplyRope bit for bit", "[cuda_sim]") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    for (int head_dim : {8, 64}) {
      const int max_positions = 50, nq = 4, nkv = 2, tokens = 3;
      const cpu::RopeTable table(max_positions, head_dim, 10000.0f);
      const int64_t stride = (nq + 2 * nkv) * head_dim;
      std::vector<float> qkv(tokens * stride);
      for (float& x : qkv) x = normal(rng);
      const std::vector<int32_t> positions = {0, 17, max_positions - 1};
      std::vector<float> want = qkv;
      for (int t = 0; t < tokens; ++t) {
        float* row = want.data() + t * stride;
        const bool inter = style == RopeStyle::kInterleaved;
        cpu::ApplyRope(row, nq, head_dim, table.cos(positions[t]), table.sin(positions[t]), inter);
        cpu::ApplyRope(row + nq * head_dim, nkv, head_dim, table.cos(positions[t]),
                       table.sin(positions[t]), inter);
      }
      RopeParams p;
      p.q = qkv.data();
      p.k = qkv.data() + nq * head_dim;
      p.q_stride = p.k_stride = stride;
      p.positions = positions.data();
      p.cos = table.cos(0);
      p.sin = table.sin(0);
      p.max_positions = max_positions;
      p.num_tokens = tokens;
      p.num_q_heads = nq;
      p.num_kv_heads = nkv;
      p.head_dim = head_dim;
      p.style = style;
      cuda_sim::Launch(rope_detail::RopeKernel<float>, dim3(tokens), rope_detail::kThreads, nullptr,
                       0, p);
      REQUIRE(std::memcmp(qkv.data(), want.data(), qkv.size() * 4) == 0);
    }
  }
}

TEST_CASE("simulated SwiGLU equals cpu::SiluMul's AVX2 path bit for bit", "[cuda_sim]") {
  if (cpu::DefaultCpuIsa() != cpu::CpuIsa::kAvx2) {
    WARN("no AVX2 here: the CPU's scalar SiluMul uses libm expf; skipping the bitwise check");
    return;
  }
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  // hidden 37: one partial block of channels; 300: a thread strides over
  // two channels. Grids smaller than the problem stride over tokens too.
  for (const int64_t hidden : {int64_t{37}, int64_t{300}}) {
    for (const dim3 grid : {dim3(1), dim3(1, 2), dim3(2, 3)}) {
      INFO("hidden " << hidden << ", grid " << grid.x << " x " << grid.y);
      const int64_t tokens = 3;
      std::vector<float> gate_up(tokens * 2 * hidden), out(tokens * hidden, -1.0f);
      for (float& x : gate_up) x = dist(rng) * (dist(rng) > 0 ? 0.1f : 1.0f);
      std::vector<float> want(tokens * hidden);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<float> gate(gate_up.begin() + t * 2 * hidden,
                                gate_up.begin() + t * 2 * hidden + hidden);
        cpu::SiluMul(gate.data(), gate_up.data() + t * 2 * hidden + hidden, hidden);
        std::copy(gate.begin(), gate.end(), want.begin() + t * hidden);
      }
      SwiGluParams p{gate_up.data(), out.data(), tokens,         hidden,
                     2 * hidden,     hidden,     ActDtype::kFp32};
      cuda_sim::Launch(swiglu_detail::SwiGluKernel<float>, grid, swiglu_detail::kThreads, nullptr,
                       0, p);
      REQUIRE(std::memcmp(out.data(), want.data(), out.size() * 4) == 0);
    }
  }
}

TEST_CASE("simulated embedding copies rows and marks bad ids with NaN", "[cuda_sim]") {
  const int64_t vocab = 5, dim = 6;
  std::vector<float> table(vocab * dim);
  std::iota(table.begin(), table.end(), 0.0f);
  const std::vector<int32_t> ids = {4, 0, 5, 4};
  for (bool vectorized : {false, true}) {
    const int64_t stride = vectorized ? 8 : 7;  // the vector path needs 16-byte rows
    const int64_t d = vectorized ? 4 : dim;
    std::vector<float> out(ids.size() * stride, -1.0f);
    EmbeddingParams p{table.data(), ids.data(), out.data(), vocab, d, 4, stride, ActDtype::kFp32};
    LaunchBody(dim3(4), embedding_detail::kThreads,
               [&] { embedding_detail::EmbeddingKernel(p, 4, vectorized); });
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t i = 0; i < stride; ++i) {
        const float got = out[t * stride + i];
        if (i >= d) {
          REQUIRE(got == -1.0f);
        } else if (ids[t] >= vocab) {
          REQUIRE(std::isnan(got));
        } else {
          REQUIRE(got == table[ids[t] * d + i]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cuda
