#include "model/loader/weight_check.h"

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "model/loader/hf_loader.h"
#include "model/loader/hf_writer.h"
#include "model/loader/llama2c_loader.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST_CASE("FirstNonFinite finds the first NaN or infinity, in and across blocks", "[model]") {
  std::vector<float> x(10000, 1.0f);
  // Extremes that are finite: the largest, the smallest normal, a denormal, -0.
  x[1] = FLT_MAX;
  x[2] = -FLT_MAX;
  x[3] = FLT_MIN;
  x[4] = FLT_MIN / 8;
  x[5] = -0.0f;
  REQUIRE(FirstNonFinite(x.data(), static_cast<int64_t>(x.size())) == -1);
  REQUIRE(FirstNonFinite(x.data(), 0) == -1);
  for (int64_t at : {0, 4095, 4096, 4097, 9999}) {
    for (float bad : {kNaN, kInf, -kInf, -kNaN}) {
      std::vector<float> y = x;
      y[at] = bad;
      if (at + 7 < 10000) y[at + 7] = kNaN;  // a later one does not matter
      INFO(at << " " << bad);
      REQUIRE(FirstNonFinite(y.data(), static_cast<int64_t>(y.size())) == at);
    }
  }
  x[9999] = kInf;
  REQUIRE(FirstNonFinite(x.data(), 9999) == -1);  // outside the range
  REQUIRE(CheckFinite(x.data(), 10000, "w", "m.bin").message() ==
          "m.bin: tensor 'w' holds +Inf at element 9999 (of 10000); the checkpoint is corrupt");
}

// stories260K (llama2.c legacy format: a 7-int header, then fp32 tensors).
std::string CopyStories(const std::string& dir) {
  const std::string path = dir + "/stories260K.bin";
  std::filesystem::copy_file(testing::Stories260kCheckpoint(), path);
  return path;
}

void PokeFloat(const std::string& path, int64_t float_index, float value) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(28 + float_index * 4);
  f.write(reinterpret_cast<const char*>(&value), sizeof(value));
  REQUIRE(f.good());
}

TEST_CASE("A llama2.c checkpoint with a NaN or infinity is refused, naming the tensor", "[model]") {
  const std::string dir = testing::MakeTempDir("nan_llama2c");
  const std::string path = CopyStories(dir);
  REQUIRE(LoadLlama2cCheckpoint(path).ok());
  // dim 64, vocab 512, 5 layers: token_embedding_table, rms_att_weight[5],
  // then wq[5][64][64]; element 5 of layer 2's wq.
  const int64_t wq_layer2 = 512 * 64 + 5 * 64 + 2 * 64 * 64;
  PokeFloat(path, wq_layer2 + 5, kNaN);
  absl::StatusOr<LlamaWeights> w = LoadLlama2cCheckpoint(path);
  REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(w.status().message() == path +
                                      ": tensor 'layers.2.wq' holds NaN at element 5 (of "
                                      "4096); the checkpoint is corrupt");
  PokeFloat(path, wq_layer2 + 5, 0.5f);
  PokeFloat(path, 100, -kInf);
  w = LoadLlama2cCheckpoint(path);
  REQUIRE(w.status().message() == path +
                                      ": tensor 'token_embedding_table' holds -Inf at element "
                                      "100 (of 32768); the checkpoint is corrupt");
}

TEST_CASE("An HF safetensors model with a NaN is refused, naming the tensor", "[model]") {
  absl::StatusOr<LlamaWeights> ref = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(ref.ok());
  for (SafetensorsDtype dtype :
       {SafetensorsDtype::kF32, SafetensorsDtype::kF16, SafetensorsDtype::kBF16}) {
    // A copy of layer 1's w_down with one NaN.
    LlamaWeights bad = *ref;
    std::vector<float> down(bad.layers[1].w_down.data,
                            bad.layers[1].w_down.data + bad.layers[1].w_down.numel());
    down[17] = kNaN;
    bad.layers[1].w_down.data = down.data();
    const std::string dir = testing::MakeTempDir("nan_hf");
    REQUIRE(WriteHfDirectory(bad, testing::Stories260kTokenizer(), dir, dtype).ok());
    absl::StatusOr<LlamaWeights> w = LoadHfDirectory(dir);
    INFO(static_cast<int>(dtype));
    REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(w.status().message() ==
            dir +
                "/model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' holds NaN at "
                "element 17 (of 11008); the checkpoint is corrupt");
  }
}

}  // namespace
}  // namespace kvserve
