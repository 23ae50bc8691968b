#include "model/loader/hf_loader.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/loader/hf_writer.h"
#include "model/loader/llama2c_loader.h"
#include "model/loader/safetensors.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {
namespace fs = std::filesystem;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

bool BitEqual(const Tensor& a, const float* b, const std::vector<int64_t>& shape) {
  return a.shape == shape &&
         std::memcmp(a.data, b, static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}
bool BitEqual(const Tensor& a, const Tensor& b) { return BitEqual(a, b.data, b.shape); }

// `want` as it reads back after a round trip through `dtype`.
std::vector<float> Rounded(const Tensor& want, SafetensorsDtype dtype) {
  std::vector<float> out(want.data, want.data + want.numel());
  for (float& v : out) {
    if (dtype == SafetensorsDtype::kF16) v = Fp16ToFp32(Fp32ToFp16(v));
    if (dtype == SafetensorsDtype::kBF16) v = Bf16ToFp32(Fp32ToBf16(v));
  }
  return out;
}

// The HF-loaded model holds exactly the llama2.c tensors (rounded to dtype),
// with wq/wk rows in rotate-half order: un-permuting gives them back.
void RequireSameAsLlama2c(const LlamaWeights& hf, const LlamaWeights& ref, SafetensorsDtype dtype) {
  const ModelConfig& c = ref.config;
  auto same = [&](const Tensor& got, const Tensor& want) {
    REQUIRE(BitEqual(got, Rounded(want, dtype).data(), want.shape));
  };
  same(hf.tok_embeddings, ref.tok_embeddings);
  same(hf.final_norm, ref.final_norm);
  same(hf.output, ref.output);
  REQUIRE(hf.layers.size() == ref.layers.size());
  for (size_t l = 0; l < ref.layers.size(); ++l) {
    INFO("layer " << l);
    const LayerWeights& a = hf.layers[l];
    const LayerWeights& b = ref.layers[l];
    std::vector<float> wq = UnpermuteRowsFromRotateHalf(a.wq, c.num_heads, c.head_dim);
    std::vector<float> wk = UnpermuteRowsFromRotateHalf(a.wk, c.num_kv_heads, c.head_dim);
    same(Tensor{wq.data(), a.wq.shape}, b.wq);
    same(Tensor{wk.data(), a.wk.shape}, b.wk);
    // The permutation really moved rows (this is not a vacuous comparison).
    REQUIRE_FALSE(BitEqual(a.wq, b.wq));
    REQUIRE_FALSE(BitEqual(a.wk, b.wk));
    same(a.wv, b.wv);
    same(a.wo, b.wo);
    same(a.attn_norm, b.attn_norm);
    same(a.ffn_norm, b.ffn_norm);
    same(a.w_gate, b.w_gate);
    same(a.w_up, b.w_up);
    same(a.w_down, b.w_down);
  }
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string ReadText(const std::string& path) { return testing::ReadFileOrDie(path); }

void ReplaceOnce(std::string* s, const std::string& from, const std::string& to) {
  const size_t at = s->find(from);
  REQUIRE(at != std::string::npos);
  s->replace(at, from.size(), to);
}

// stories260K converted into a fresh directory.
std::string ConvertStories(const LlamaWeights& ref, const std::string& prefix,
                           SafetensorsDtype dtype = SafetensorsDtype::kF32) {
  const std::string dir = testing::MakeTempDir(prefix);
  REQUIRE(WriteHfDirectory(ref, testing::Stories260kTokenizer(), dir, dtype).ok());
  return dir;
}

TEST_CASE("Rotate-half row permutation matches HF's view/transpose/reshape", "[model]") {
  // 2 heads of head_dim 4, one column holding the row index.
  std::vector<float> rows = {0, 1, 2, 3, 4, 5, 6, 7};
  Tensor w{rows.data(), {8, 1}};
  // w.view(2, 2, 2, 1).transpose(1, 2).reshape(8, 1): per head (0,2,1,3).
  std::vector<float> permuted = PermuteRowsForRotateHalf(w, 2, 4);
  REQUIRE(permuted == std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7});
  Tensor p{permuted.data(), {8, 1}};
  REQUIRE(UnpermuteRowsFromRotateHalf(p, 2, 4) == rows);

  // head_dim 8 moves whole rows of every column.
  std::vector<float> wide(8 * 3);
  for (int r = 0; r < 8; ++r) {
    for (int col = 0; col < 3; ++col) wide[r * 3 + col] = r * 10 + col;
  }
  std::vector<float> pw = PermuteRowsForRotateHalf(Tensor{wide.data(), {8, 3}}, 1, 8);
  const int want_rows[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int r = 0; r < 8; ++r) {
    for (int col = 0; col < 3; ++col) REQUIRE(pw[r * 3 + col] == want_rows[r] * 10 + col);
  }
}

TEST_CASE("A converted llama2.c model loads back with identical tensors", "[model]") {
  auto ref = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(ref.ok());

  SECTION("fp32: config.json, generation_config.json, tokenizer and exact weights") {
    const std::string dir = ConvertStories(*ref, "hf-f32");
    for (const char* f :
         {"config.json", "model.safetensors", "tokenizer.model", "generation_config.json"}) {
      REQUIRE(fs::is_regular_file(fs::path(dir) / f));
    }
    REQUIRE(ReadText(dir + "/tokenizer.model") == ReadText(testing::Stories260kTokenizer()));
    const std::string config = ReadText(dir + "/config.json");
    REQUIRE(config.find("\"kvserve_bos_is_stop\": true") != std::string::npos);
    REQUIRE(config.find("\"rms_norm_eps\": 1e-05") != std::string::npos);

    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.ok());
    const ModelConfig& c = hf->config;
    REQUIRE(c.architecture == "LlamaForCausalLM");
    REQUIRE(c.dim == 64);
    REQUIRE(c.hidden_dim == 172);
    REQUIRE(c.num_layers == 5);
    REQUIRE(c.num_heads == 8);
    REQUIRE(c.num_kv_heads == 4);
    REQUIRE(c.head_dim == 8);
    REQUIRE(c.vocab_size == 512);
    REQUIRE(c.max_position_embeddings == 512);
    REQUIRE(c.rope_theta == ref->config.rope_theta);
    REQUIRE(c.rms_norm_eps == ref->config.rms_norm_eps);
    REQUIRE(c.tie_word_embeddings);
    REQUIRE(c.sliding_window == 0);
    REQUIRE(c.bos_id == 1);
    REQUIRE(c.eos_id == 2);
    REQUIRE(c.bos_is_stop);
    // generation_config.json's eos_token_id [2, 1] adds BOS as a stop id.
    REQUIRE(c.stop_ids == std::vector<int32_t>{1});
    REQUIRE_FALSE(c.default_temperature.has_value());
    REQUIRE(c.rope_style == RopeStyle::kNeox);
    REQUIRE(hf->output.data == hf->tok_embeddings.data);
    RequireSameAsLlama2c(*hf, *ref, SafetensorsDtype::kF32);

    auto st = SafetensorsFile::Open(dir + "/model.safetensors");
    REQUIRE(st.ok());
    REQUIRE((*st)->entries().size() == 1 + 5 * 9 + 1);  // tied: no lm_head.weight
    REQUIRE((*st)->Find("lm_head.weight") == nullptr);
  }
  for (SafetensorsDtype dtype : {SafetensorsDtype::kF16, SafetensorsDtype::kBF16}) {
    DYNAMIC_SECTION(SafetensorsDtypeName(dtype) << ": the same tensors, rounded once") {
      const std::string dir = ConvertStories(*ref, "hf-half", dtype);
      auto hf = LoadHfDirectory(dir);
      REQUIRE(hf.ok());
      RequireSameAsLlama2c(*hf, *ref, dtype);
    }
  }
  SECTION("an untied model gets lm_head.weight") {
    LlamaWeights untied = *ref;
    untied.config.tie_word_embeddings = false;
    std::vector<float> cls(ref->tok_embeddings.data,
                           ref->tok_embeddings.data + ref->tok_embeddings.numel());
    for (float& v : cls) v *= 0.5f;  // distinguishable from the embeddings
    untied.output = Tensor{cls.data(), ref->tok_embeddings.shape};
    const std::string dir = ConvertStories(untied, "hf-untied");
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.ok());
    REQUIRE_FALSE(hf->config.tie_word_embeddings);
    REQUIRE(hf->output.data != hf->tok_embeddings.data);
    RequireSameAsLlama2c(*hf, untied, SafetensorsDtype::kF32);
  }
}

TEST_CASE("Sharded HF directories load through model.safetensors.index.json", "[model]") {
  auto ref = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(ref.ok());
  const std::string single = ConvertStories(*ref, "hf-single");
  auto whole = LoadHfDirectory(single);
  REQUIRE(whole.ok());

  // Split the single file into two shards: embeddings + layers 0-1 | the rest.
  auto st = SafetensorsFile::Open(single + "/model.safetensors");
  REQUIRE(st.ok());
  std::vector<NamedTensor> shard[2];
  std::vector<std::vector<float>> keep;
  std::string weight_map;
  for (const auto& [name, entry] : (*st)->entries()) {
    const bool first = name == "model.embed_tokens.weight" ||
                       name.rfind("model.layers.0.", 0) == 0 ||
                       name.rfind("model.layers.1.", 0) == 0;
    keep.emplace_back();
    auto t = (*st)->ReadFp32(name, &keep.back());
    REQUIRE(t.ok());
    shard[first ? 0 : 1].push_back({name, *t});
    const std::string file =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    weight_map += (weight_map.empty() ? "" : ",") + ("\"" + name + "\":\"" + file + "\"");
  }
  const std::string dir = testing::MakeTempDir("hf-sharded");
  REQUIRE(
      WriteSafetensors(dir + "/model-00001-of-00002.safetensors", shard[0], SafetensorsDtype::kBF16)
          .ok());
  REQUIRE(
      WriteSafetensors(dir + "/model-00002-of-00002.safetensors", shard[1], SafetensorsDtype::kF32)
          .ok());
  const std::string index = "{\"metadata\":{},\"weight_map\":{" + weight_map + "}}";
  WriteText(dir + "/model.safetensors.index.json", index);
  fs::copy_file(single + "/config.json", dir + "/config.json");

  SECTION("tensors come from both shards, each in its own dtype") {
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.ok());
    std::vector<float> emb = Rounded(whole->tok_embeddings, SafetensorsDtype::kBF16);
    REQUIRE(BitEqual(hf->tok_embeddings, emb.data(), whole->tok_embeddings.shape));
    std::vector<float> q1 = Rounded(whole->layers[1].wq, SafetensorsDtype::kBF16);
    REQUIRE(BitEqual(hf->layers[1].wq, q1.data(), whole->layers[1].wq.shape));
    for (int l = 2; l < 5; ++l) {
      REQUIRE(BitEqual(hf->layers[l].wq, whole->layers[l].wq));
      REQUIRE(BitEqual(hf->layers[l].w_down, whole->layers[l].w_down));
    }
    REQUIRE(BitEqual(hf->final_norm, whole->final_norm));
  }
  SECTION("a tensor missing from the weight_map is NotFound naming the index") {
    std::string broken = index;
    ReplaceOnce(&broken, "\"model.norm.weight\"", "\"model.norm.weight.renamed\"");
    WriteText(dir + "/model.safetensors.index.json", broken);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(hf.status(), "tensor 'model.norm.weight' not found: it is not in " + dir +
                                      "/model.safetensors.index.json"));
  }
  SECTION("a tensor the index puts in the wrong shard is NotFound naming both") {
    std::string broken = index;
    ReplaceOnce(&broken, "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"",
                "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"");
    WriteText(dir + "/model.safetensors.index.json", broken);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(hf.status(), "tensor 'model.norm.weight' not found in " + dir +
                                      "/model-00001-of-00002.safetensors"));
  }
  SECTION("a missing shard file is NotFound naming it") {
    fs::remove(dir + "/model-00002-of-00002.safetensors");
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(hf.status(), dir + "/model-00002-of-00002.safetensors"));
  }
  SECTION("an index without weight_map is InvalidArgument") {
    WriteText(dir + "/model.safetensors.index.json", "{\"metadata\":{}}");
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(hf.status(), dir + "/model.safetensors.index.json: field 'weight_map'"));
  }
}

TEST_CASE("config.json of Llama and Mistral models parses with HF's defaults", "[model]") {
  const std::string dir = testing::MakeTempDir("hf-config");
  const std::string path = dir + "/config.json";

  SECTION("a Mistral config with sliding window, GQA and an eos list") {
    WriteText(path, R"({
      "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
      "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "max_position_embeddings": 32768, "vocab_size": 32000, "rms_norm_eps": 1e-05,
      "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
      "bos_token_id": 1, "eos_token_id": [2, 32000], "torch_dtype": "bfloat16"})");
    auto c = ParseHfConfig(path);
    REQUIRE(c.ok());
    REQUIRE(c->architecture == "MistralForCausalLM");
    REQUIRE(c->num_kv_heads == 8);
    REQUIRE(c->head_dim == 128);
    REQUIRE(c->sliding_window == 4096);
    REQUIRE(c->eos_id == 2);
    REQUIRE(c->stop_ids == std::vector<int32_t>{32000});  // the rest of the eos list
    REQUIRE(c->rms_norm_eps == 1e-5f);
    REQUIRE_FALSE(c->bos_is_stop);
    REQUIRE(c->rope_style == RopeStyle::kNeox);
  }
  SECTION("optional fields take their defaults") {
    WriteText(path, R"({
      "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
      "vocab_size": 300, "sliding_window": null, "head_dim": 32})");
    auto c = ParseHfConfig(path);
    REQUIRE(c.ok());
    REQUIRE(c->num_kv_heads == 4);  // = num_attention_heads
    REQUIRE(c->head_dim == 32);     // explicit, not hidden_size / heads
    REQUIRE(c->rope_theta == 10000.0f);
    REQUIRE(c->rms_norm_eps == 1e-6f);  // transformers' LlamaConfig default
    REQUIRE_FALSE(c->tie_word_embeddings);
    REQUIRE(c->sliding_window == 0);
    REQUIRE(c->bos_id == 1);
    REQUIRE(c->eos_id == 2);
  }
  SECTION("bad fields are InvalidArgument naming the file and field") {
    const std::string base = R"("hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
      "vocab_size": 300)";
    const std::pair<std::string, std::string> cases[] = {
        {R"({"architectures": ["LlamaForCausalLM"], "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
            "vocab_size": 300})",
         "field 'hidden_size' is missing"},
        {R"({"architectures": ["GPT2LMHeadModel"], )" + base + "}",
         "field 'architectures' names 'GPT2LMHeadModel'"},
        {R"({"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 3, )" + base + "}",
         "model config: num_kv_heads = 3"},
        {R"({"architectures": ["LlamaForCausalLM"], "rope_theta": "big", )" + base + "}",
         "field 'rope_theta' is not a number"},
        {R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu", )" + base + "}",
         "field 'hidden_act' is \"gelu\""},
        {R"({"architectures": ["LlamaForCausalLM"],
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0}, )" +
             base + "}",
         "field 'rope_scaling.original_max_position_embeddings' is missing"},
        {R"({"architectures": ["LlamaForCausalLM"],
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}, )" +
             base + "}",
         "field 'rope_scaling' has type 'yarn'; supported: linear, dynamic, llama3"},
        {R"({"architectures": ["LlamaForCausalLM"],
            "rope_scaling": {"type": "linear", "factor": 0.5}, )" +
             base + "}",
         "field 'rope_scaling.factor' must be >= 1"},
        {R"({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, )" + base + "}",
         "field 'use_sliding_window' is true"},
        {R"({"architectures": ["LlamaForCausalLM"], "mlp_bias": true, )" + base + "}",
         "field 'mlp_bias' is true"},
        {R"({"model_type": "gpt_neox", )" + base + "}",
         "field 'model_type' 'gpt_neox' is not supported"},
        {R"({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": 1, )" + base + "}",
         "field 'tie_word_embeddings' is not true/false"},
        {R"({"architectures": ["LlamaForCausalLM"], "eos_token_id": [2, "x"], )" + base + "}",
         "field 'eos_token_id' is not a token id or a list of them"},
    };
    for (const auto& [text, want] : cases) {
      INFO(text);
      WriteText(path, text);
      auto c = ParseHfConfig(path);
      REQUIRE(c.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(Contains(c.status(), path + ": "));
      REQUIRE(Contains(c.status(), want));
    }
  }
}

TEST_CASE("Broken HF directories are clear errors naming the file and field", "[model]") {
  auto ref = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(ref.ok());
  const std::string dir = ConvertStories(*ref, "hf-broken");
  const std::string weights = dir + "/model.safetensors";

  SECTION("no config.json: NotFound") {
    fs::remove(dir + "/config.json");
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(hf.status(), dir + ": no config.json"));
  }
  SECTION("config.json that is not JSON: InvalidArgument") {
    WriteText(dir + "/config.json", "{\"hidden_size\": 64,");
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(hf.status(), dir + "/config.json: not valid JSON"));
  }
  SECTION("no weights file: NotFound") {
    fs::remove(weights);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(hf.status(), dir + ": neither model.safetensors nor "
                                        "model.safetensors.index.json found"));
  }
  // Rewrites model.safetensors with `edit` applied to its list of tensors.
  auto rewrite = [&](auto edit) {
    auto st = SafetensorsFile::Open(weights);
    REQUIRE(st.ok());
    std::vector<NamedTensor> tensors;
    std::vector<std::vector<float>> keep;
    for (const auto& [name, entry] : (*st)->entries()) {
      keep.emplace_back();
      auto t = (*st)->ReadFp32(name, &keep.back());
      REQUIRE(t.ok());
      tensors.push_back({name, *t});
    }
    edit(&tensors);
    const std::string tmp = dir + "/rewritten.safetensors";
    REQUIRE(WriteSafetensors(tmp, tensors, SafetensorsDtype::kF32).ok());
    fs::rename(tmp, weights);
  };
  SECTION("a missing tensor: NotFound naming the tensor and the file") {
    rewrite([](std::vector<NamedTensor>* t) {
      std::erase_if(
          *t, [](const NamedTensor& n) { return n.name == "model.layers.3.mlp.up_proj.weight"; });
    });
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(std::string(hf.status().message()) ==
            "tensor 'model.layers.3.mlp.up_proj.weight' not found in " + weights);
  }
  SECTION("a tensor of the wrong shape: InvalidArgument with expected and actual") {
    rewrite([](std::vector<NamedTensor>* t) {
      for (NamedTensor& n : *t) {
        if (n.name == "model.layers.2.self_attn.k_proj.weight") n.tensor.shape = {64, 32};
      }
    });
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(hf.status().message()) ==
            weights +
                ": tensor 'model.layers.2.self_attn.k_proj.weight' has shape [64, 32] "
                "but config.json implies [32, 64]");
  }
  SECTION("a config that disagrees with the tensors: InvalidArgument") {
    std::string config = ReadText(dir + "/config.json");
    ReplaceOnce(&config, "\"vocab_size\": 512", "\"vocab_size\": 500");
    WriteText(dir + "/config.json", config);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(hf.status(),
                     "tensor 'model.embed_tokens.weight' has shape [512, 64] but "
                     "config.json implies [500, 64]"));
  }
  SECTION("an unknown dtype: InvalidArgument naming the tensor and dtype") {
    // Same element size, so the header stays consistent: only the dtype is bad.
    std::string bytes = ReadText(weights);
    ReplaceOnce(&bytes, "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"F32\"",
                "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"I32\"");
    WriteText(weights, bytes);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(hf.status(), weights + ": tensor 'model.layers.0.self_attn.q_proj.weight' "
                                            "has dtype 'I32'"));
  }
  SECTION("a truncated weights file: DataLoss naming the file and the tensor") {
    fs::resize_file(weights, fs::file_size(weights) - 4);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(hf.status(), weights + ": tensor '"));
    REQUIRE(Contains(hf.status(), "the file is truncated"));
  }
  SECTION("a weights header that is not JSON: InvalidArgument") {
    std::string bytes = ReadText(weights);
    bytes[8] = '[';
    WriteText(weights, bytes);
    auto hf = LoadHfDirectory(dir);
    REQUIRE(hf.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(hf.status(), weights + ": header is not valid JSON"));
  }
}

}  // namespace
}  // namespace kvserve
