// The CUDA KV write against cpu::WriteKv: for every KvFormat, head_dim 8,
// 64 and 128 and block sizes 1, 16 and 32, the pool the GPU writes equals
// the pool the CPU writes byte for byte (bound: zero differing bytes, pages
// poisoned with the same random bytes first, so untouched bytes are checked
// too), and the CPU's DequantizeRow reads the GPU-written rows back within
// the format's error.
#include "kernels/cuda/kv/kv_write.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cache/format/kv_format.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "tests/kernels/cuda/device_buffer.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::DeviceBuffer;
using ::kvserve::testing::FromF;
using ::kvserve::testing::RequireBadField;
using ::kvserve::testing::RequireOk;
using ::kvserve::testing::SameBits;
using ::kvserve::testing::ToF;

// Rows of K/V values: mostly gaussian at a row-dependent magnitude, with
// some all-zero, constant and past-fp16-range rows (never -0: the CPU's AVX2
// and scalar int4 paths store a -0 minimum differently, see
// tests/kernels/kv_encode_test.cc).
std::vector<float> RandomActivations(int64_t rows, int row_len, std::mt19937_64* rng,
                                     std::vector<bool>* ordinary) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * row_len);
  ordinary->assign(rows, true);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * row_len;
    switch (r % 11) {
      case 3:
        std::fill(row, row + row_len, 0.0f);
        break;
      case 5:
        std::fill(row, row + row_len, 1.75f);
        break;
      case 7:
        for (int i = 0; i < row_len; ++i) row[i] = 7e4f * normal(*rng);
        (*ordinary)[r] = false;  // fp16 saturates
        break;
      default: {
        const float mag = std::pow(10.0f, static_cast<float>(r % 5) - 2.0f);
        for (int i = 0; i < row_len; ++i) row[i] = mag * (normal(*rng) + (r % 2 ? 0.5f : 0.0f));
      }
    }
  }
  return x;
}

// Worst |decoded - x| allowed for an ordinary row, relative to its |x| max.
double DecodeBound(KvElem elem) {
  switch (elem) {
    case KvElem::kFp32:
      return 0.0;
    case KvElem::kFp16:
      return 1e-3;
    case KvElem::kBf16:
      return 8e-3;
    case KvElem::kFp8E4m3:
      return 0.07;  // 3 mantissa bits: half a step is 1/16 of the value
    case KvElem::kInt8:
      return 0.5 / 127 + 1e-6;
    case KvElem::kInt4:
      return 1.05 / 15;         // half a level of a range up to 2 amax, fp16 zero
    case KvElem::kInt4Channel:  // int4_kc is not written by the CUDA kernels
      return 0.0;
  }
  return 0.0;
}

struct Case {
  KvDtype dtype;
  int head_dim;
  int block_size;
  int num_kv_heads = 2;
  int group = 64;
  int tokens = 37;
  ActDtype act = ActDtype::kFp32;
  bool fused_rows = false;  // K and V inside one [T][(4 + 2 * hkv) * hd] QKV-like row
};

template <typename T>
void RunCase(const Case& c, uint64_t seed) {
  INFO(KvDtypeName(c.dtype) << " head_dim " << c.head_dim << " block_size " << c.block_size
                            << " heads " << c.num_kv_heads << " group " << c.group << " act "
                            << static_cast<int>(c.act) << " fused " << c.fused_rows);
  const absl::StatusOr<KvFormat> format =
      KvFormat::Create(c.dtype, c.num_kv_heads, c.head_dim, c.block_size, c.group);
  REQUIRE(format.ok());
  const KvPageLayout& layout = format->layout();
  std::mt19937_64 rng(seed);
  const int32_t num_blocks = (c.tokens + c.block_size - 1) / c.block_size + 3;
  const int64_t pool_bytes = static_cast<int64_t>(num_blocks) * layout.block_bytes;

  // Distinct slots, every fifth token skipped.
  std::vector<int64_t> all_slots(static_cast<size_t>(num_blocks) * c.block_size);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.tokens);
  for (int t = 0; t < c.tokens; t += 5) slots[t] = -1;

  const int row_elems = c.num_kv_heads * c.head_dim;
  std::vector<bool> k_ordinary, v_ordinary;
  std::vector<float> k = RandomActivations(static_cast<int64_t>(c.tokens) * c.num_kv_heads,
                                           c.head_dim, &rng, &k_ordinary);
  std::vector<float> v = RandomActivations(static_cast<int64_t>(c.tokens) * c.num_kv_heads,
                                           c.head_dim, &rng, &v_ordinary);
  // The activations as the GPU stores them, and the exact floats they are.
  const int64_t stride = c.fused_rows ? (4 + 2 * c.num_kv_heads) * c.head_dim : row_elems;
  const int64_t k_offset = c.fused_rows ? 4 * c.head_dim : 0;
  const int64_t v_offset = c.fused_rows ? k_offset + row_elems : 0;
  std::vector<T> k_act(c.tokens * stride, FromF<T>(NAN)), v_act(c.tokens * stride, FromF<T>(NAN));
  for (int t = 0; t < c.tokens; ++t) {
    for (int i = 0; i < row_elems; ++i) {
      const int64_t src = static_cast<int64_t>(t) * row_elems + i;
      k_act[t * stride + k_offset + i] = FromF<T>(k[src]);
      v_act[t * stride + v_offset + i] = FromF<T>(v[src]);
      k[src] = ToF(k_act[t * stride + k_offset + i]);
      v[src] = ToF(v_act[t * stride + v_offset + i]);
    }
  }

  std::vector<uint8_t> poison(pool_bytes);
  for (uint8_t& b : poison) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> want = poison;
  cpu::KvWriteParams cp;
  cp.k = k.data();
  cp.v = v.data();
  cp.slot_mapping = slots.data();
  cp.num_tokens = c.tokens;
  cp.kv.pages = want.data();
  cp.kv.num_blocks = num_blocks;
  cp.kv.layout = layout;
  cpu::WriteKv(cp);

  DeviceBuffer d_pool(pool_bytes), d_slots(slots.size() * 8);
  DeviceBuffer d_k(k_act.size() * sizeof(T)), d_v(v_act.size() * sizeof(T));
  d_pool.Upload(poison);
  d_slots.Upload(slots);
  d_k.Upload(k_act);
  d_v.Upload(v_act);
  KvWriteParams p;
  p.k = d_k.as<T>(k_offset);
  p.v = d_v.as<T>(v_offset);
  p.k_stride = c.fused_rows ? stride : 0;
  p.v_stride = c.fused_rows ? stride : 0;
  p.slot_mapping = d_slots.as<int64_t>();
  p.num_tokens = c.tokens;
  p.kv.pages = d_pool.as<uint8_t>();
  p.kv.num_blocks = num_blocks;
  p.kv.layout = layout;
  p.dtype = c.act;
  RequireOk(WriteKv(p, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = d_pool.Download<uint8_t>(pool_bytes);

  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < pool_bytes; ++i) {
    if (got[i] != want[i]) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  INFO("differing bytes " << differing << ", first at " << first << " (block "
                          << (first < 0 ? -1 : first / layout.block_bytes) << ")");
  REQUIRE(differing == 0);

  // The CPU decodes what the GPU wrote, within the format's error.
  std::vector<float> back(c.head_dim);
  for (int t = 0; t < c.tokens; ++t) {
    if (slots[t] < 0) continue;
    const uint8_t* block = got.data() + (slots[t] / c.block_size) * layout.block_bytes;
    const int off = static_cast<int>(slots[t] % c.block_size);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const int64_t row = static_cast<int64_t>(t) * c.num_kv_heads + h;
      for (int part = 0; part < 2; ++part) {
        const KvPartLayout& pl = part == 0 ? layout.k : layout.v;
        if (!(part == 0 ? k_ordinary : v_ordinary)[row]) continue;
        const float* x = (part == 0 ? k : v).data() + row * c.head_dim;
        cpu::DequantizeRow(pl, c.head_dim, block + layout.RowOffset(pl, h, off),
                           block + layout.MetaOffset(pl, h, off), back.data());
        float amax = 0.0f;
        for (int i = 0; i < c.head_dim; ++i) amax = std::max(amax, std::fabs(x[i]));
        for (int i = 0; i < c.head_dim; ++i) {
          INFO("token " << t << " head " << h << " part " << part << " channel " << i);
          REQUIRE(std::fabs(back[i] - x[i]) <= DecodeBound(pl.elem) * amax + 1e-30);
        }
      }
    }
  }
}

TEST_CASE("WriteKv writes cpu::WriteKv's bytes for every format and shape", "[gpu]") {
  uint64_t seed = 1;
  for (KvDtype dtype : kAllKvDtypes) {
    for (int head_dim : {8, 64, 128}) {
      for (int block_size : {1, 16, 32}) {
        RunCase<float>({dtype, head_dim, block_size}, seed++);
      }
    }
    // More heads, a smaller int4 group, and the widest head.
    RunCase<float>({dtype, 128, 16, /*num_kv_heads=*/8, /*group=*/32}, seed++);
    RunCase<float>({dtype, 256, 16, 1, 64, /*tokens=*/5}, seed++);
  }
}

TEST_CASE("WriteKv widens fp16/bf16 activations exactly and reads fused QKV rows", "[gpu]") {
  uint64_t seed = 100;
  for (KvDtype dtype : kAllKvDtypes) {
    RunCase<__half>({dtype, 64, 16, 2, 64, 37, ActDtype::kFp16}, seed++);
    RunCase<__nv_bfloat16>({dtype, 64, 16, 2, 64, 37, ActDtype::kBf16}, seed++);
    RunCase<float>({dtype, 64, 16, 4, 64, 37, ActDtype::kFp32, /*fused_rows=*/true}, seed++);
    RunCase<__nv_bfloat16>({dtype, 128, 32, 2, 64, 37, ActDtype::kBf16, true}, seed++);
  }
}

TEST_CASE("WriteKv skips negative and out-of-pool slots", "[gpu]") {
  const absl::StatusOr<KvFormat> format = KvFormat::Create(KvDtype::kInt8, 1, 8, 4);
  REQUIRE(format.ok());
  const int32_t num_blocks = 2;
  const int64_t pool_bytes = num_blocks * format->block_bytes();
  std::vector<uint8_t> poison(pool_bytes, 0x5a);
  DeviceBuffer d_pool(pool_bytes + 256), d_slots(3 * 8), d_kv(3 * 8 * 4);
  d_pool.Upload(std::vector<uint8_t>(pool_bytes + 256, 0x5a));
  d_slots.Upload(std::vector<int64_t>{-1, 8, 1000});  // 8 = num_blocks * block_size
  d_kv.Upload(std::vector<float>(24, 1.0f));
  KvWriteParams p;
  p.k = p.v = d_kv.as<float>();
  p.slot_mapping = d_slots.as<int64_t>();
  p.num_tokens = 3;
  p.kv.pages = d_pool.as<uint8_t>();
  p.kv.num_blocks = num_blocks;
  p.kv.layout = format->layout();
  RequireOk(WriteKv(p, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  REQUIRE(d_pool.Download<uint8_t>(pool_bytes + 256) ==
          std::vector<uint8_t>(pool_bytes + 256, 0x5a));
}

TEST_CASE("WriteKv rejects bad params naming the field", "[gpu]") {
  const absl::StatusOr<KvFormat> format = KvFormat::Create(KvDtype::kInt4, 2, 64, 16, 32);
  REQUIRE(format.ok());
  DeviceBuffer buffer(1 << 16);
  KvWriteParams p;
  p.k = p.v = buffer.as<float>();
  p.slot_mapping = buffer.as<int64_t>();
  p.num_tokens = 1;
  p.kv.pages = buffer.as<uint8_t>();
  p.kv.num_blocks = 1;
  p.kv.layout = format->layout();
  SECTION("head_dim") {
    p.kv.layout.head_dim = 513;
    RequireBadField(WriteKv(p, nullptr), "head_dim");
  }
  SECTION("int4 group") {
    p.kv.layout.k.group_size = 48;
    RequireBadField(WriteKv(p, nullptr), "kv.layout.k.group_size");
  }
  SECTION("a row size that does not match the element type") {
    p.kv.layout.v.row_bytes = 64;
    RequireBadField(WriteKv(p, nullptr), "kv.layout.v");
  }
  SECTION("strides") {
    p.k_stride = 100;
    RequireBadField(WriteKv(p, nullptr), "k_stride");
  }
  SECTION("null pointers") {
    p.slot_mapping = nullptr;
    RequireBadField(WriteKv(p, nullptr), "slot_mapping");
  }
  SECTION("zero tokens launch nothing, even with null pointers") {
    p.num_tokens = 0;
    p.k = p.v = nullptr;
    RequireOk(WriteKv(p, nullptr));
  }
}

}  // namespace
}  // namespace kvserve::cuda
