// Embedding lookup on the GPU against cpu::Embedding (fp32) and a plain row
// copy (fp16/bf16): exact bytes, padded output rows untouched, invalid ids
// turned into NaN rows.
#include "kernels/cuda/layers/embedding.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/layers/ops.h"
#include "tests/kernels/cuda/device_buffer.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::DeviceBuffer;
using ::kvserve::testing::RequireBadField;
using ::kvserve::testing::RequireOk;

TEST_CASE("Embedding copies the CPU's rows", "[gpu]") {
  std::mt19937_64 rng(5);
  const int64_t vocab = 50, tokens = 11;
  for (int64_t dim : {3, 64, 4096}) {
    for (int64_t pad : {0, 1, 8}) {
      INFO("dim " << dim << " pad " << pad);
      std::vector<float> table(vocab * dim);
      std::normal_distribution<float> normal;
      for (float& v : table) v = normal(rng);
      std::vector<int32_t> ids(tokens);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (int32_t& id : ids) id = pick(rng);
      ids[3] = ids[4];  // a repeat
      const int64_t stride = dim + pad;

      {  // fp32 equals cpu::Embedding
        std::vector<float> dense(tokens * dim);
        cpu::Embedding(table.data(), ids.data(), tokens, dim, dense.data());
        DeviceBuffer d_table(table.size() * 4), d_ids(tokens * 4), d_out(tokens * stride * 4);
        d_table.Upload(table);
        d_ids.Upload(ids);
        d_out.Upload(std::vector<float>(tokens * stride, -3.0f));
        EmbeddingParams p{
            d_table.as<float>(), d_ids.as<int32_t>(), d_out.as<float>(), vocab, dim, tokens, stride,
            ActDtype::kFp32};
        RequireOk(Embedding(p, nullptr));
        REQUIRE_CUDA(cudaDeviceSynchronize());
        const std::vector<float> got = d_out.Download<float>(tokens * stride);
        for (int64_t t = 0; t < tokens; ++t) {
          REQUIRE(std::memcmp(&got[t * stride], &dense[t * dim], dim * 4) == 0);
          for (int64_t i = dim; i < stride; ++i) REQUIRE(got[t * stride + i] == -3.0f);
        }
      }
      {  // 16-bit rows are copied verbatim
        std::vector<uint16_t> codes(vocab * dim);
        for (uint16_t& c : codes) c = static_cast<uint16_t>(rng());
        DeviceBuffer d_table(codes.size() * 2), d_ids(tokens * 4), d_out(tokens * stride * 2);
        d_table.Upload(codes);
        d_ids.Upload(ids);
        d_out.Upload(std::vector<uint16_t>(tokens * stride, 0xabcd));
        EmbeddingParams p{d_table.as<uint16_t>(),
                          d_ids.as<int32_t>(),
                          d_out.as<uint16_t>(),
                          vocab,
                          dim,
                          tokens,
                          stride,
                          ActDtype::kBf16};
        RequireOk(Embedding(p, nullptr));
        REQUIRE_CUDA(cudaDeviceSynchronize());
        const std::vector<uint16_t> got = d_out.Download<uint16_t>(tokens * stride);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t i = 0; i < stride; ++i) {
            REQUIRE(got[t * stride + i] == (i < dim ? codes[ids[t] * dim + i] : 0xabcd));
          }
        }
      }
    }
  }
}

TEST_CASE("Embedding writes NaN rows for ids outside the vocabulary", "[gpu]") {
  const int64_t vocab = 4, dim = 6;
  DeviceBuffer d_table(vocab * dim * 4), d_ids(3 * 4), d_out(3 * dim * 4);
  d_table.Upload(std::vector<float>(vocab * dim, 1.0f));
  d_ids.Upload(std::vector<int32_t>{-1, 2, 4});
  for (ActDtype dtype : {ActDtype::kFp32, ActDtype::kFp16, ActDtype::kBf16}) {
    EmbeddingParams p{
        d_table.as<float>(), d_ids.as<int32_t>(), d_out.as<float>(), vocab, dim, 3, 0, dtype};
    RequireOk(Embedding(p, nullptr));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    if (dtype == ActDtype::kFp32) {
      const std::vector<float> got = d_out.Download<float>(3 * dim);
      for (int64_t i = 0; i < dim; ++i) {
        REQUIRE(std::isnan(got[i]));
        REQUIRE(got[dim + i] == 1.0f);
        REQUIRE(std::isnan(got[2 * dim + i]));
      }
    } else {
      const std::vector<uint16_t> got = d_out.Download<uint16_t>(3 * dim);
      const uint16_t nan = dtype == ActDtype::kFp16 ? 0x7e00 : 0x7fc0;
      for (int64_t i = 0; i < dim; ++i) {
        REQUIRE(got[i] == nan);
        REQUIRE(got[2 * dim + i] == nan);
      }
    }
  }
}

TEST_CASE("Embedding rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(4096);
  EmbeddingParams p{buffer.as<float>(), buffer.as<int32_t>(), buffer.as<float>(), 4, 8, 1, 0,
                    ActDtype::kFp32};
  SECTION("vocab") {
    p.vocab = 0;
    RequireBadField(Embedding(p, nullptr), "vocab");
  }
  SECTION("out_stride") {
    p.out_stride = 7;
    RequireBadField(Embedding(p, nullptr), "out_stride");
  }
  SECTION("ids") {
    p.ids = nullptr;
    RequireBadField(Embedding(p, nullptr), "ids");
  }
}

}  // namespace
}  // namespace kvserve::cuda
