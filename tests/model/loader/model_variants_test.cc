// HF model variants against an independent reference: small random-weight
// checkpoints of each variant kvserve loads (Llama-3.1 "llama3" RoPE scaling,
// linear scaling with attention biases, Qwen2's q/k/v biases with tied
// embeddings, Qwen3's per-head q/k RMSNorm with an explicit head_dim wider
// than hidden_size / heads) are written as HF directories, loaded by the HF
// loader, run through the CPU backend in a prefill chunk, a second chunk and
// single decode steps, and compared with tests/model/python/reference_forward.py,
// a numpy float64 forward written from the transformers modeling code.
// Needs python3 with numpy (Debian python3-numpy); skipped with a message
// without it.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/batch_input.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/loader/hf_loader.h"
#include "model/loader/hf_writer.h"
#include "tests/model/random_weights.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

struct Variant {
  std::string name;
  ModelConfig config;
};

ModelConfig SmallConfig(const char* arch) {
  ModelConfig c;
  c.architecture = arch;
  c.dim = 64;
  c.hidden_dim = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 101;
  c.max_position_embeddings = 256;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-6f;
  c.rope_style = RopeStyle::kNeox;
  c.bos_id = 1;
  c.eos_id = 2;
  return c;
}

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  {
    // With head_dim 16 and theta 1e4 the channel pairs' wavelengths are 6.3,
    // 20, 63, ...: one is kept (< 32/4), one is blended, the rest are / 8.
    ModelConfig c = SmallConfig("LlamaForCausalLM");
    c.rope_scaling = {RopeScalingType::kLlama3, 8.0f, 1.0f, 4.0f, 32};
    v.push_back({"llama-3.1 rope scaling", c});
  }
  {
    ModelConfig c = SmallConfig("LlamaForCausalLM");
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = 2.5f;
    c.qkv_bias = c.o_bias = true;
    c.num_kv_heads = 1;  // MQA
    v.push_back({"llama linear scaling + attention_bias", c});
  }
  {
    ModelConfig c = SmallConfig("Qwen2ForCausalLM");
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
    v.push_back({"qwen2 q/k/v biases, tied embeddings", c});
  }
  {
    ModelConfig c = SmallConfig("Qwen3ForCausalLM");
    c.qk_norm = true;
    c.head_dim = 32;  // q_dim 128 > hidden 64, as Qwen3-0.6B's 2048 > 1024
    c.rope_theta = 1000000.0f;
    v.push_back({"qwen3 q/k norm, explicit head_dim", c});
  }
  return v;
}

// Logits of every token of `ids`: a 12-token prefill, a 9-token chunk after
// it, then single decode steps, with the K/V cache in between.
std::vector<std::vector<float>> KvserveLogits(const LlamaWeights& w,
                                              const std::vector<int32_t>& ids) {
  CpuRunnerOptions opt;
  opt.block_size = 16;
  opt.num_blocks = 8;
  opt.num_threads = 1;
  auto runner = CpuModelRunner::Create(w, opt);
  REQUIRE(runner.ok());
  const int vocab = w.config.vocab_size;
  const int32_t total = static_cast<int32_t>(ids.size());
  std::vector<std::vector<float>> out;
  int32_t done = 0;
  while (done < total) {
    const int32_t n = done == 0 ? 12 : done == 12 ? 9 : 1;
    BatchInput b;
    b.Clear();
    b.max_blocks_per_seq = 4;
    b.block_table = {3, 0, 6, 1};  // shuffled physical blocks
    b.context_len = {done + n};
    b.query_start = {0, n};
    for (int32_t i = done; i < done + n; ++i) {
      b.token_ids.push_back(ids[i]);
      b.positions.push_back(i);
      b.slot_mapping.push_back(int64_t{b.block_table[i / 16]} * 16 + i % 16);
      b.logits_rows.push_back(i - done);
    }
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    REQUIRE((*runner)->Forward(b, logits).ok());
    for (int32_t r = 0; r < n; ++r) {
      out.emplace_back(logits.begin() + int64_t{r} * vocab,
                       logits.begin() + int64_t{r + 1} * vocab);
    }
    done += n;
  }
  return out;
}

TEST_CASE("HF variants: logits equal an independent numpy reference forward", "[model]") {
  const std::string python = testing::PythonWithModule("numpy");
  if (python.empty()) {
    WARN("no python3 with numpy (Debian package python3-numpy): skipping");
    return;
  }
  const std::string script =
      std::string(KVSERVE_SOURCE_DIR) + "/tests/model/python/reference_forward.py";
  std::vector<int32_t> ids;
  for (int i = 0; i < 28; ++i) ids.push_back((i * 37 + 5) % 101);
  uint32_t seed = 7;
  for (const Variant& v : Variants()) {
    DYNAMIC_SECTION(v.name) {
      const LlamaWeights w = testing::RandomWeights(v.config, seed++);
      const std::string dir = testing::MakeTempDir("hf-variant");
      REQUIRE(WriteHfDirectory(w, testing::Stories260kTokenizer(), dir).ok());
      absl::StatusOr<LlamaWeights> loaded = LoadHfDirectory(dir);
      REQUIRE(loaded.ok());
      const ModelConfig& lc = loaded->config;
      REQUIRE(lc.architecture == v.config.architecture);
      REQUIRE(lc.qkv_bias == v.config.qkv_bias);
      REQUIRE(lc.o_bias == v.config.o_bias);
      REQUIRE(lc.qk_norm == v.config.qk_norm);
      REQUIRE(lc.head_dim == v.config.head_dim);
      REQUIRE(lc.rope_scaling.type == v.config.rope_scaling.type);
      REQUIRE(lc.rope_scaling.factor == v.config.rope_scaling.factor);

      const std::vector<std::vector<float>> got = KvserveLogits(*loaded, ids);
      { std::ofstream(dir + "/ids.json") << nlohmann::json(ids).dump(); }
      std::string out;
      const int rc = testing::RunShell(python + " " + testing::ShellQuote(script) + " " +
                                           testing::ShellQuote(dir) + " " +
                                           testing::ShellQuote(dir + "/ids.json") + " 2>&1",
                                       &out);
      INFO(out.substr(0, 2000));
      REQUIRE(rc == 0);
      const nlohmann::json want = nlohmann::json::parse(out);
      REQUIRE(want.size() == ids.size());
      double max_err = 0, max_logit = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        REQUIRE(want[t].size() == static_cast<size_t>(v.config.vocab_size));
        for (int i = 0; i < v.config.vocab_size; ++i) {
          const double ref = want[t][i].get<double>();
          max_err = std::max(max_err, std::abs(ref - got[t][i]));
          max_logit = std::max(max_logit, std::abs(ref));
        }
      }
      INFO("max |logit| " << max_logit << ", max error " << max_err);
      // fp32 forward of 2 layers at width 64 against float64: rounding only.
      REQUIRE(max_logit > 1.0);
      REQUIRE(max_err < 2e-5 * max_logit + 1e-5);
    }
  }
}

}  // namespace
}  // namespace kvserve
