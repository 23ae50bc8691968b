#include "model/loader/llama2c_loader.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace kvserve {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}

// Every tensor of `got` equals the one of `want`, bit for bit.
void RequireSameWeights(const LlamaWeights& got, const LlamaWeights& want) {
  REQUIRE(got.layers.size() == want.layers.size());
  REQUIRE(BitEqual(got.tok_embeddings, want.tok_embeddings));
  REQUIRE(BitEqual(got.final_norm, want.final_norm));
  REQUIRE(BitEqual(got.output, want.output));
  for (size_t l = 0; l < want.layers.size(); ++l) {
    INFO("layer " << l);
    for (Tensor LayerWeights::*m :
         {&LayerWeights::attn_norm, &LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv,
          &LayerWeights::wo, &LayerWeights::ffn_norm, &LayerWeights::w_gate, &LayerWeights::w_down,
          &LayerWeights::w_up}) {
      REQUIRE(BitEqual(got.layers[l].*m, want.layers[l].*m));
    }
  }
}

void RequireSameConfig(const ModelConfig& a, const ModelConfig& b) {
  REQUIRE(a.dim == b.dim);
  REQUIRE(a.hidden_dim == b.hidden_dim);
  REQUIRE(a.num_layers == b.num_layers);
  REQUIRE(a.num_heads == b.num_heads);
  REQUIRE(a.num_kv_heads == b.num_kv_heads);
  REQUIRE(a.head_dim == b.head_dim);
  REQUIRE(a.vocab_size == b.vocab_size);
  REQUIRE(a.max_position_embeddings == b.max_position_embeddings);
}

void Truncate(const std::string& path, size_t size) { std::filesystem::resize_file(path, size); }

void WriteBytes(const std::string& path, const void* data, size_t n) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), n);
}

TEST_CASE("stories260K loads with its documented shape", "[model]") {
  auto w = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(w.ok());
  const ModelConfig& c = w->config;
  REQUIRE(c.name == "stories260K");
  REQUIRE(c.dim == 64);
  REQUIRE(c.hidden_dim == 172);
  REQUIRE(c.num_layers == 5);
  REQUIRE(c.num_heads == 8);
  REQUIRE(c.num_kv_heads == 4);
  REQUIRE(c.head_dim == 8);
  REQUIRE(c.vocab_size == 512);
  REQUIRE(c.max_position_embeddings == 512);
  REQUIRE(c.tie_word_embeddings);
  REQUIRE(c.rope_style == RopeStyle::kInterleaved);
  REQUIRE(c.bos_is_stop);
  REQUIRE(w->output.data == w->tok_embeddings.data);
  REQUIRE(w->layers[4].wk.shape == std::vector<int64_t>{32, 64});
  REQUIRE(w->layers[4].w_down.shape == std::vector<int64_t>{64, 172});
}

TEST_CASE("llama2.c checkpoints round-trip bit-exactly in both header versions", "[model]") {
  auto orig = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(orig.ok());
  const std::string dir = testing::MakeTempDir("llama2c");

  SECTION("version 1 with a shared classifier") {
    const std::string path = dir + "/v1.bin";
    REQUIRE(WriteLlama2cCheckpoint(*orig, path, 1).ok());
    auto back = LoadLlama2cCheckpoint(path);
    REQUIRE(back.ok());
    RequireSameConfig(back->config, orig->config);
    REQUIRE(back->config.tie_word_embeddings);
    REQUIRE(back->output.data == back->tok_embeddings.data);
    RequireSameWeights(*back, *orig);
  }

  // An untied model: the classifier is a separate copy of the embeddings.
  LlamaWeights untied = *orig;
  untied.config.tie_word_embeddings = false;
  std::vector<float> cls(orig->tok_embeddings.data,
                         orig->tok_embeddings.data + orig->tok_embeddings.numel());
  untied.output = Tensor{cls.data(), orig->tok_embeddings.shape};

  for (int version : {0, 1}) {
    DYNAMIC_SECTION("version " << version << " with a separate classifier") {
      const std::string path = dir + "/untied-v" + std::to_string(version) + ".bin";
      REQUIRE(WriteLlama2cCheckpoint(untied, path, version).ok());
      auto back = LoadLlama2cCheckpoint(path);
      REQUIRE(back.ok());
      RequireSameConfig(back->config, orig->config);
      REQUIRE_FALSE(back->config.tie_word_embeddings);
      REQUIRE(back->output.data != back->tok_embeddings.data);
      RequireSameWeights(*back, untied);
      // A separate classifier adds exactly vocab x dim floats to the file.
      const std::string tied_path = dir + "/tied-v" + std::to_string(version) + ".bin";
      REQUIRE(WriteLlama2cCheckpoint(*orig, tied_path, version).ok());
      REQUIRE(std::filesystem::file_size(path) - std::filesystem::file_size(tied_path) ==
              512u * 64u * sizeof(float));
    }
  }
}

TEST_CASE("Truncated llama2.c checkpoints name the file and the tensor", "[model]") {
  auto orig = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(orig.ok());
  const std::string dir = testing::MakeTempDir("llama2c-trunc");

  SECTION("legacy header, cut inside the first layer's wq") {
    const std::string path = dir + "/cut.bin";
    REQUIRE(WriteLlama2cCheckpoint(*orig, path, 0).ok());
    // 28-byte header, embeddings 512x64, attention norms 5x64, then wq.
    Truncate(path, 28 + (512 * 64 + 5 * 64 + 100) * 4);
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(w.status(), path + ": truncated checkpoint: tensor 'wq'"));
  }
  SECTION("version 1, missing the last byte of the separate classifier") {
    LlamaWeights untied = *orig;
    untied.config.tie_word_embeddings = false;
    const std::string path = dir + "/cut-v1.bin";
    REQUIRE(WriteLlama2cCheckpoint(untied, path, 1).ok());
    Truncate(path, std::filesystem::file_size(path) - 1);
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(w.status(), path + ": truncated checkpoint: tensor 'wcls'"));
  }
  SECTION("a file shorter than the legacy header") {
    const std::string path = dir + "/tiny.bin";
    const int32_t two[2] = {64, 172};
    WriteBytes(path, two, sizeof(two));
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(w.status(), path + ": truncated header (8 bytes)"));
  }
  SECTION("a version-1 file cut inside its 256-byte header") {
    const std::string path = dir + "/v1head.bin";
    REQUIRE(WriteLlama2cCheckpoint(*orig, path, 1).ok());
    Truncate(path, 100);
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(w.status(), path + ": truncated version-1 header"));
  }
}

TEST_CASE("Bad llama2.c headers are InvalidArgument naming the file and field", "[model]") {
  const std::string dir = testing::MakeTempDir("llama2c-header");
  std::vector<char> bytes(4096, 0);

  SECTION("an unknown version after the ak42 magic") {
    const uint32_t magic = 0x616b3432;
    const int32_t version = 2;
    std::memcpy(bytes.data(), &magic, 4);
    std::memcpy(bytes.data() + 4, &version, 4);
    const std::string path = dir + "/v2.bin";
    WriteBytes(path, bytes.data(), bytes.size());
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(w.status(), path + ": llama2.c checkpoint version 2 is not supported"));
  }
  SECTION("zero heads") {
    const int32_t hdr[7] = {64, 172, 5, 0, 4, 512, 512};
    std::memcpy(bytes.data(), hdr, sizeof(hdr));
    const std::string path = dir + "/heads.bin";
    WriteBytes(path, bytes.data(), bytes.size());
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(w.status(), path + ": bad llama2.c header: model config: num_heads = 0"));
  }
  SECTION("kv heads that do not divide the heads") {
    const int32_t hdr[7] = {64, 172, 5, 8, 3, 512, 512};
    std::memcpy(bytes.data(), hdr, sizeof(hdr));
    const std::string path = dir + "/kv.bin";
    WriteBytes(path, bytes.data(), bytes.size());
    auto w = LoadLlama2cCheckpoint(path);
    REQUIRE(w.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(w.status(), path + ": bad llama2.c header: model config: num_kv_heads = 3"));
  }
  SECTION("a missing file is NotFound") {
    auto w = LoadLlama2cCheckpoint(dir + "/absent.bin");
    REQUIRE(w.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(w.status(), dir + "/absent.bin"));
  }
}

}  // namespace
}  // namespace kvserve
