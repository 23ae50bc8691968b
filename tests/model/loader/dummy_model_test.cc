#include "model/loader/dummy_model.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kvserve {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// Sets an environment variable for one scope and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST_CASE("Dummy presets have the shapes of the published models", "[model]") {
  REQUIRE(DummyPresetNames() == std::vector<std::string>{"tiny", "llama-2-7b", "llama-2-70b",
                                                         "llama-3-8b", "mistral-7b",
                                                         "stories110m-shape", "tiny-hd64"});
  SECTION("parameter counts match the real checkpoints") {
    const std::pair<const char*, int64_t> counts[] = {{"llama-2-7b", 6738415616},
                                                      {"llama-2-70b", 68976648192},
                                                      {"llama-3-8b", 8030261248},
                                                      {"mistral-7b", 7241732096},
                                                      {"stories110m-shape", 85740288}};
    for (const auto& [name, params] : counts) {
      auto c = DummyPresetConfig(name);
      REQUIRE(c.ok());
      REQUIRE(c->Validate().ok());
      REQUIRE(c->NumParams() == params);
    }
  }
  SECTION("the fields that differ between the families") {
    auto l3 = DummyPresetConfig("dummy:llama-3-8b");  // the prefix is optional
    REQUIRE(l3.ok());
    REQUIRE(l3->name == "llama-3-8b");
    REQUIRE(l3->num_kv_heads == 8);
    REQUIRE(l3->head_dim == 128);
    REQUIRE(l3->vocab_size == 128256);
    REQUIRE(l3->max_position_embeddings == 8192);
    REQUIRE(l3->rope_theta == 500000.0f);
    REQUIRE(l3->bos_id == 128000);
    auto m = DummyPresetConfig("mistral-7b");
    REQUIRE(m.ok());
    REQUIRE(m->architecture == "MistralForCausalLM");
    REQUIRE(m->sliding_window == 4096);
    REQUIRE(m->max_position_embeddings == 32768);
    auto l70 = DummyPresetConfig("llama-2-70b");
    REQUIRE(l70.ok());
    REQUIRE(l70->dim == 8192);
    REQUIRE(l70->hidden_dim == 28672);
    REQUIRE(l70->num_layers == 80);
    REQUIRE(l70->num_heads == 64);
    REQUIRE(l70->num_kv_heads == 8);
    auto tiny = DummyPresetConfig("tiny");
    REQUIRE(tiny.ok());
    REQUIRE(tiny->dim == 128);
    REQUIRE(tiny->num_layers == 4);
    REQUIRE(tiny->vocab_size == 512);
    REQUIRE(tiny->rope_style == RopeStyle::kNeox);
  }
  SECTION("an unknown preset lists the known ones") {
    auto c = DummyPresetConfig("dummy:nope");
    REQUIRE(c.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(c.status().message()) ==
            "unknown dummy model preset 'nope'; known presets: tiny, llama-2-7b, llama-2-70b, "
            "llama-3-8b, mistral-7b, stories110m-shape, tiny-hd64");
  }
}

TEST_CASE("Dummy weights are seeded, small and of the preset's shape", "[model]") {
  auto w = LoadDummyModel("dummy:tiny", kDefaultDummyMaxBytes);
  REQUIRE(w.ok());
  const ModelConfig& c = w->config;
  REQUIRE(w->layers.size() == 4);
  REQUIRE(w->tok_embeddings.shape == std::vector<int64_t>{512, 128});
  REQUIRE(w->layers[3].wk.shape == std::vector<int64_t>{64, 128});
  REQUIRE(w->layers[3].w_down.shape == std::vector<int64_t>{128, c.hidden_dim});
  REQUIRE(w->output.data == w->tok_embeddings.data);  // tiny is tied

  SECTION("the same seed gives the same bits, another seed other bits") {
    auto again = LoadDummyModel("tiny", kDefaultDummyMaxBytes);
    REQUIRE(again.ok());
    const size_t bytes = static_cast<size_t>(c.NumParams()) * sizeof(float);
    // One buffer backs every tensor, starting at the embeddings.
    REQUIRE(std::memcmp(w->tok_embeddings.data, again->tok_embeddings.data, bytes) == 0);
    auto other = LoadDummyModel("tiny", kDefaultDummyMaxBytes, /*seed=*/7);
    REQUIRE(other.ok());
    REQUIRE(std::memcmp(w->tok_embeddings.data, other->tok_embeddings.data, 512 * 4) != 0);
  }
  SECTION("matrices have mean ~0 and std ~0.02; norms are 1") {
    const Tensor& t = w->layers[1].w_gate;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      sum += t.data[i];
      sq += double(t.data[i]) * t.data[i];
    }
    const double mean = sum / t.numel();
    const double stddev = std::sqrt(sq / t.numel() - mean * mean);
    REQUIRE(std::abs(mean) < 5e-4);
    REQUIRE(stddev > 0.0195);
    REQUIRE(stddev < 0.0205);
    for (int64_t i = 0; i < 128; ++i) {
      REQUIRE(w->layers[2].attn_norm.data[i] == 1.0f);
      REQUIRE(w->final_norm.data[i] == 1.0f);
    }
  }
}

TEST_CASE("Dummy models refuse to allocate more than the byte limit", "[model]") {
  SECTION("llama-2-7b is over the default 8 GiB") {
    auto w = LoadDummyModel("dummy:llama-2-7b", kDefaultDummyMaxBytes);
    REQUIRE(w.status().code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(std::string(w.status().message()) ==
            "dummy:llama-2-7b needs 25.10 GiB of fp32 weights (6738415616 parameters), over the "
            "limit of 8.00 GiB; set KVSERVE_DUMMY_MAX_BYTES to allow more (shapes alone come "
            "from DummyPresetConfig)");
  }
  SECTION("even tiny is refused under a tiny limit") {
    auto w = LoadDummyModel("tiny", 1000);
    REQUIRE(w.status().code() == absl::StatusCode::kResourceExhausted);
  }
  SECTION("KVSERVE_DUMMY_MAX_BYTES sets the limit") {
    {
      ScopedEnv env("KVSERVE_DUMMY_MAX_BYTES", nullptr);
      REQUIRE(*DummyMaxBytesFromEnv() == kDefaultDummyMaxBytes);
      REQUIRE(LoadDummyModel("dummy:llama-3-8b").status().code() ==
              absl::StatusCode::kResourceExhausted);
    }
    {
      ScopedEnv env("KVSERVE_DUMMY_MAX_BYTES", "64GiB");
      REQUIRE(*DummyMaxBytesFromEnv() == (uint64_t{64} << 30));
    }
    {
      ScopedEnv env("KVSERVE_DUMMY_MAX_BYTES", "64GB");
      REQUIRE(*DummyMaxBytesFromEnv() == uint64_t{64000000000});
    }
    {
      ScopedEnv env("KVSERVE_DUMMY_MAX_BYTES", "1048576");
      REQUIRE(*DummyMaxBytesFromEnv() == 1048576);
      REQUIRE(LoadDummyModel("tiny").status().code() == absl::StatusCode::kResourceExhausted);
    }
    {
      ScopedEnv env("KVSERVE_DUMMY_MAX_BYTES", "lots");
      auto limit = DummyMaxBytesFromEnv();
      REQUIRE(limit.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(Contains(limit.status(), "KVSERVE_DUMMY_MAX_BYTES: 'lots' is not a byte size"));
    }
  }
}

}  // namespace
}  // namespace kvserve
