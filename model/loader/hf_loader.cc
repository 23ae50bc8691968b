#include "model/loader/hf_loader.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/loader/generation_config.h"
#include "model/loader/quantize_weights.h"
#include "model/loader/safetensors.h"
#include "model/loader/weight_check.h"
#include "util/json_file.h"
#include "util/status_macros.h"

namespace kvserve {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr char kConfigFile[] = "config.json";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// Typed access to config.json fields; every error names the file and field.
class ConfigReader {
 public:
  ConfigReader(const std::string& path, const json& j) : path_(path), j_(j) {}

  absl::Status Bad(const std::string& field, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": field '", field, "' ", why));
  }
  // nullptr when the field is absent or null.
  const json* Get(const std::string& field) const {
    auto it = j_.find(field);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::StatusOr<int> Int(const std::string& field, std::optional<int> fallback) const {
    const json* v = Get(field);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Bad(field, "is missing");
    }
    if (!v->is_number_integer() || v->get<int64_t>() < INT32_MIN || v->get<int64_t>() > INT32_MAX) {
      return Bad(field, absl::StrCat("is not a 32-bit integer: ", v->dump()));
    }
    return static_cast<int>(v->get<int64_t>());
  }

  absl::StatusOr<float> Float(const std::string& field, std::optional<float> fallback) const {
    const json* v = Get(field);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Bad(field, "is missing");
    }
    if (!v->is_number()) return Bad(field, absl::StrCat("is not a number: ", v->dump()));
    return v->get<float>();
  }

  absl::StatusOr<bool> Bool(const std::string& field, bool fallback) const {
    const json* v = Get(field);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Bad(field, absl::StrCat("is not true/false: ", v->dump()));
    return v->get<bool>();
  }

  // A token id, or a list of them (the first one counts).
  absl::StatusOr<int32_t> TokenId(const std::string& field, int32_t fallback) const {
    const json* v = Get(field);
    if (v == nullptr) return fallback;
    const json* id = v;
    if (v->is_array()) {
      if (v->empty()) return fallback;
      id = &(*v)[0];
    }
    if (!id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX) {
      return Bad(field, absl::StrCat("is not a token id or a list of them: ", v->dump()));
    }
    return static_cast<int32_t>(id->get<int64_t>());
  }

 private:
  const std::string& path_;
  const json& j_;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// What keeps the tensors of an HF model alive: the mmapped files (F32 views
// point into them) and the fp32 copies of F16/BF16 tensors.
struct HfStorage {
  std::vector<std::shared_ptr<SafetensorsFile>> files;
  std::deque<std::vector<float>> converted;  // a deque never moves its elements
};

// Finds tensors by name across the model's safetensors file(s).
class TensorSource {
 public:
  static absl::StatusOr<TensorSource> Open(const std::string& dir, FileAccess access,
                                           HfStorage* storage) {
    TensorSource src;
    src.storage_ = storage;
    const std::string index_path = (fs::path(dir) / kIndexFile).string();
    const std::string single_path = (fs::path(dir) / kSingleFile).string();
    if (fs::exists(index_path)) {
      src.index_path_ = index_path;
      KV_ASSIGN_OR_RETURN(json index, ReadJsonFile(index_path));
      auto map = index.is_object() ? index.find("weight_map") : index.end();
      if (map == index.end() || !map->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": field 'weight_map' is missing or not an object"));
      }
      std::map<std::string, int> shard_of_file;
      for (const auto& [tensor, file] : map->items()) {
        if (!file.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(index_path, ": field 'weight_map' entry '",
                                                         tensor, "' is not a file name"));
        }
        const std::string name = file.get<std::string>();
        auto [it, inserted] = shard_of_file.emplace(name, static_cast<int>(storage->files.size()));
        if (inserted) {
          KV_ASSIGN_OR_RETURN(auto shard,
                              SafetensorsFile::Open((fs::path(dir) / name).string(), access));
          storage->files.push_back(std::move(shard));
        }
        src.weight_map_[tensor] = it->second;
      }
    } else if (fs::exists(single_path)) {
      KV_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path, access));
      storage->files.push_back(std::move(file));
    } else {
      return absl::NotFoundError(absl::StrCat(dir, ": neither ", kSingleFile, " nor ", kIndexFile,
                                              " found: no weights in this HF directory"));
    }
    return src;
  }

  // The file holding `name` (NotFound naming what was searched).
  absl::StatusOr<const SafetensorsFile*> FileOf(const std::string& name) const {
    const SafetensorsFile* file;
    if (!index_path_.empty()) {
      auto it = weight_map_.find(name);
      if (it == weight_map_.end()) {
        return absl::NotFoundError(absl::StrCat("tensor '", name, "' not found: it is not in ",
                                                index_path_, " (weight_map)"));
      }
      file = storage_->files[it->second].get();
      if (file->Find(name) == nullptr) {
        return absl::NotFoundError(absl::StrCat("tensor '", name, "' not found in ", file->path(),
                                                " (where ", index_path_, " puts it)"));
      }
    } else {
      file = storage_->files[0].get();
      if (file->Find(name) == nullptr) {
        return absl::NotFoundError(absl::StrCat("tensor '", name, "' not found in ", file->path()));
      }
    }
    return file;
  }

  // The dtype of `name` as stored ("" when absent).
  std::string DtypeOf(const std::string& name) const {
    absl::StatusOr<const SafetensorsFile*> file = FileOf(name);
    return file.ok() ? (*file)->Find(name)->dtype : std::string();
  }

  // An fp8 checkpoint's matrix `name` ([rows][cols] F8_E4M3) with its
  // `name`_scale: one value (per tensor: every row gets it) or one a row
  // ([rows] or [rows, 1], per channel), in any float dtype.
  absl::StatusOr<Fp8Matrix> GetFp8(const std::string& name, int64_t rows, int64_t cols) {
    KV_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
    const SafetensorsEntry& e = *file->Find(name);
    if (e.shape != std::vector<int64_t>{rows, cols}) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": tensor '", name, "' has shape ", ShapeString(e.shape),
                       " but config.json implies ", ShapeString({rows, cols})));
    }
    KV_ASSIGN_OR_RETURN(std::span<const uint8_t> codes, file->ReadRaw(name, "F8_E4M3"));
    const std::string scale_name = name + "_scale";
    if (DtypeOf(scale_name).empty() && !DtypeOf(name + "_scale_inv").empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name,
                       "_scale_inv': block-wise fp8 scales are not supported (per-tensor "
                       "and per-channel weight_scale are)"));
    }
    KV_ASSIGN_OR_RETURN(const SafetensorsFile* sfile, FileOf(scale_name));
    const SafetensorsEntry& se = *sfile->Find(scale_name);
    int64_t n = 1;
    for (int64_t d : se.shape) n *= d;
    const bool per_row = n == rows && (se.shape == std::vector<int64_t>{rows} ||
                                       se.shape == std::vector<int64_t>{rows, 1});
    if (n != 1 && !per_row) {
      return absl::InvalidArgumentError(absl::StrCat(
          sfile->path(), ": tensor '", scale_name, "' has shape ", ShapeString(se.shape),
          "; expected one scale ([] or [1]) or one per output channel ([", rows, "] or [", rows,
          ", 1])"));
    }
    std::vector<float> converted;
    KV_ASSIGN_OR_RETURN(Tensor st, sfile->ReadFp32(scale_name, &converted));
    KV_RETURN_IF_ERROR(CheckFinite(st.data, st.numel(), scale_name, sfile->path()));
    Fp8Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.codes.assign(codes.begin(), codes.end());
    m.scales.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const float v = st.data[per_row ? r : 0];
      if (!(v >= 0.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat(sfile->path(), ": tensor '", scale_name, "' holds a negative scale: ", v));
      }
      m.scales[static_cast<size_t>(r)] = v;
    }
    return m;
  }

  // The tensor `name` as fp32, after checking it has shape `expected`.
  absl::StatusOr<Tensor> Get(const std::string& name, const std::vector<int64_t>& expected) {
    KV_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
    const SafetensorsEntry& e = *file->Find(name);
    if (e.shape != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": tensor '", name, "' has shape ", ShapeString(e.shape),
                       " but config.json implies ", ShapeString(expected)));
    }
    std::vector<float> converted;
    KV_ASSIGN_OR_RETURN(Tensor t, file->ReadFp32(name, &converted));
    KV_RETURN_IF_ERROR(CheckFinite(t.data, t.numel(), name, file->path()));
    if (!converted.empty()) storage_->converted.push_back(std::move(converted));
    return t;
  }

 private:
  HfStorage* storage_ = nullptr;
  std::string index_path_;                 // empty: single file
  std::map<std::string, int> weight_map_;  // tensor -> index in storage_->files
};

}  // namespace

std::string HfLayerTensorName(int layer, const char* suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

namespace {

// config.json "rope_scaling": {"rope_type" (or "type"): linear | dynamic |
// llama3 | default, "factor", ...}. Anything else is refused by name: plain
// RoPE in its place would silently give wrong outputs.
absl::StatusOr<RopeScaling> ParseRopeScaling(const ConfigReader& r, const json& rs) {
  RopeScaling s;
  if (!rs.is_object()) return r.Bad("rope_scaling", absl::StrCat("is not an object: ", rs.dump()));
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (auto it = rs.find(key); it != rs.end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  auto number = [&](const char* key, float fallback) -> absl::StatusOr<float> {
    auto it = rs.find(key);
    if (it == rs.end() || it->is_null()) return fallback;
    if (!it->is_number()) {
      return r.Bad(absl::StrCat("rope_scaling.", key),
                   absl::StrCat("is not a number: ", it->dump()));
    }
    return it->get<float>();
  };
  if (type == "default") return s;
  if (type == "linear") {
    s.type = RopeScalingType::kLinear;
  } else if (type == "dynamic") {
    s.type = RopeScalingType::kDynamic;
  } else if (type == "llama3") {
    s.type = RopeScalingType::kLlama3;
  } else {
    return r.Bad("rope_scaling",
                 absl::StrCat("has type '", type, "'; supported: linear, dynamic, llama3"));
  }
  KV_ASSIGN_OR_RETURN(s.factor, number("factor", 1.0f));
  if (!(s.factor >= 1.0f)) return r.Bad("rope_scaling.factor", "must be >= 1");
  KV_ASSIGN_OR_RETURN(s.low_freq_factor, number("low_freq_factor", 1.0f));
  KV_ASSIGN_OR_RETURN(s.high_freq_factor, number("high_freq_factor", 4.0f));
  float orig = 0;
  KV_ASSIGN_OR_RETURN(orig, number("original_max_position_embeddings", 0.0f));
  s.original_max_position_embeddings = static_cast<int>(orig);
  if (s.type == RopeScalingType::kLlama3 && s.original_max_position_embeddings <= 0) {
    return r.Bad("rope_scaling.original_max_position_embeddings", "is missing (llama3 needs it)");
  }
  return s;
}

// config.json "quantization_config": absent, false; an fp8_e4m3 checkpoint
// kvserve loads as shipped (per-tensor or per-channel weight scales), true;
// anything else an error naming the field. Two kinds:
//   {"quant_method": "fp8", "activation_scheme": ..., "fmt": "e4m3"} with no
//       weight_block_size (vLLM's and AutoFP8's serialization);
//   {"quant_method": "compressed-tensors", "format": "float-quantized" or
//       "naive-quantized", "config_groups": {NAME: {"weights": {"num_bits":
//       8, "type": "float", "strategy": "tensor" or "channel"}, ...}}}
//       (llm-compressor's FP8 and FP8_DYNAMIC schemes).
// The activation settings (static input_scale, dynamic per token) are not
// read: the CUDA runner quantizes every GEMM input per token at run time.
absl::StatusOr<bool> ParseFp8QuantizationConfig(const ConfigReader& r) {
  const json* q = r.Get("quantization_config");
  if (q == nullptr) return false;
  const std::string f = "quantization_config";
  if (!q->is_object()) return r.Bad(f, absl::StrCat("is not an object: ", q->dump()));
  auto it = q->find("quant_method");
  if (it == q->end() || !it->is_string()) return r.Bad(f + ".quant_method", "is missing");
  const std::string method = it->get<std::string>();
  if (method == "fp8") {
    if (auto b = q->find("weight_block_size"); b != q->end() && !b->is_null()) {
      return r.Bad(f + ".weight_block_size",
                   absl::StrCat("is ", b->dump(),
                                "; block-wise fp8 scales are not supported (per-tensor and "
                                "per-channel weight_scale are)"));
    }
    if (auto fmt = q->find("fmt"); fmt != q->end() && *fmt != "e4m3") {
      return r.Bad(f + ".fmt", absl::StrCat("is ", fmt->dump(), "; only \"e4m3\" is supported"));
    }
    return true;
  }
  if (method != "compressed-tensors") {
    return r.Bad(f + ".quant_method",
                 absl::StrCat("is '", method,
                              "'; supported: fp8 and compressed-tensors (fp8_e4m3 weights)"));
  }
  if (auto fmt = q->find("format");
      fmt != q->end() && *fmt != "float-quantized" && *fmt != "naive-quantized") {
    return r.Bad(f + ".format",
                 absl::StrCat("is ", fmt->dump(),
                              "; supported: \"float-quantized\" and \"naive-quantized\" (fp8)"));
  }
  auto groups = q->find("config_groups");
  if (groups == q->end() || !groups->is_object() || groups->empty()) {
    return r.Bad(f + ".config_groups", "is missing or not an object of schemes");
  }
  for (const auto& [name, group] : groups->items()) {
    const std::string g = absl::StrCat(f, ".config_groups.", name, ".weights");
    const json* w = group.is_object() && group.contains("weights") ? &group["weights"] : nullptr;
    if (w == nullptr || !w->is_object()) return r.Bad(g, "is missing or not an object");
    auto field = [&](const char* key) { return w->contains(key) ? (*w)[key] : json(); };
    if (field("num_bits") != 8 || field("type") != "float") {
      return r.Bad(
          g, absl::StrCat("is num_bits ", field("num_bits").dump(), ", type ", field("type").dump(),
                          "; only fp8 weights (num_bits 8, type \"float\") are supported"));
    }
    if (field("strategy") != "tensor" && field("strategy") != "channel") {
      return r.Bad(g + ".strategy",
                   absl::StrCat("is ", field("strategy").dump(),
                                "; supported: \"tensor\" and \"channel\" (not block or group)"));
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& config_path) {
  KV_ASSIGN_OR_RETURN(json j, ReadJsonFile(config_path));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  ConfigReader r(config_path, j);
  ModelConfig c;

  static constexpr std::pair<const char*, const char*> kArchitectures[] = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},
  };
  if (const json* archs = r.Get("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return r.Bad("architectures", "is not a list of names");
    }
    c.architecture = (*archs)[0].get<std::string>();
  } else if (const json* type = r.Get("model_type"); type != nullptr && type->is_string()) {
    const std::string t = type->get<std::string>();
    for (const auto& [model_type, arch] : kArchitectures) {
      if (t == model_type) c.architecture = arch;
    }
    if (c.architecture.empty()) {
      return r.Bad("model_type", absl::StrCat("'", t,
                                              "' is not supported (llama, mistral, "
                                              "qwen2, qwen3 are)"));
    }
  } else {
    return r.Bad("architectures", "is missing (and no model_type names a supported one)");
  }
  bool known = false;
  for (const auto& [model_type, arch] : kArchitectures) known |= c.architecture == arch;
  if (!known) {
    return r.Bad("architectures", absl::StrCat("names '", c.architecture,
                                               "'; supported: LlamaForCausalLM, "
                                               "MistralForCausalLM, Qwen2ForCausalLM, "
                                               "Qwen3ForCausalLM"));
  }
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  if (const json* act = r.Get("hidden_act"); act != nullptr && *act != "silu") {
    return r.Bad("hidden_act", absl::StrCat("is ", act->dump(), "; only \"silu\" is supported"));
  }
  if (const json* rs = r.Get("rope_scaling")) {
    KV_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(r, *rs));
  }
  // Qwen2 always has q/k/v biases (and none on o_proj); Llama, Mistral and
  // Qwen3 put one on all four projections when attention_bias says so.
  bool attention_bias = false;
  KV_ASSIGN_OR_RETURN(attention_bias, r.Bool("attention_bias", false));
  c.qkv_bias = qwen2 || attention_bias;
  c.o_bias = !qwen2 && attention_bias;
  c.qk_norm = qwen3;
  if (r.Get("mlp_bias") != nullptr && r.Get("mlp_bias")->is_boolean() && *r.Get("mlp_bias")) {
    return r.Bad("mlp_bias", "is true; MLP biases are not supported");
  }

  KV_ASSIGN_OR_RETURN(c.dim, r.Int("hidden_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c.hidden_dim, r.Int("intermediate_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c.num_layers, r.Int("num_hidden_layers", std::nullopt));
  KV_ASSIGN_OR_RETURN(c.num_heads, r.Int("num_attention_heads", std::nullopt));
  KV_ASSIGN_OR_RETURN(c.num_kv_heads, r.Int("num_key_value_heads", c.num_heads));
  if (r.Get("head_dim") != nullptr) {
    KV_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", std::nullopt));
  } else {
    if (c.num_heads <= 0 || c.dim % c.num_heads != 0) {
      return r.Bad("num_attention_heads",
                   absl::StrCat("= ", c.num_heads, " does not divide hidden_size ", c.dim,
                                " (and there is no head_dim)"));
    }
    c.head_dim = c.dim / c.num_heads;
  }
  KV_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", std::nullopt));
  KV_ASSIGN_OR_RETURN(c.rope_theta, r.Float("rope_theta", 10000.0f));
  KV_ASSIGN_OR_RETURN(c.rms_norm_eps, r.Float("rms_norm_eps", 1e-6f));  // transformers' default
  KV_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  KV_ASSIGN_OR_RETURN(c.sliding_window, r.Int("sliding_window", 0));
  if (qwen2 || qwen3) {
    // Qwen configs carry a sliding_window that only use_sliding_window turns
    // on, and then only for layers past max_window_layers.
    bool use_sw = false;
    KV_ASSIGN_OR_RETURN(use_sw, r.Bool("use_sliding_window", false));
    if (use_sw) {
      return r.Bad("use_sliding_window",
                   "is true; per-layer sliding windows (max_window_layers) are not supported");
    }
    c.sliding_window = 0;
  }
  KV_ASSIGN_OR_RETURN(c.bos_id, r.TokenId("bos_token_id", 1));
  KV_ASSIGN_OR_RETURN(c.eos_id, r.TokenId("eos_token_id", 2));
  if (const json* eos = r.Get("eos_token_id")) {
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> eos_ids,
                        ParseTokenIds(*eos, config_path, "eos_token_id"));
    for (int32_t id : eos_ids) c.AddStopId(id);
  }
  KV_ASSIGN_OR_RETURN(c.bos_is_stop, r.Bool("kvserve_bos_is_stop", false));
  c.rope_style = RopeStyle::kNeox;

  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", s.message()));
  }
  KV_RETURN_IF_ERROR(ParseFp8QuantizationConfig(r).status());
  return c;
}

absl::StatusOr<LlamaWeights> LoadHfDirectory(const std::string& dir, FileAccess access) {
  const fs::path d(dir);
  const std::string config_path = (d / kConfigFile).string();
  if (!fs::exists(config_path)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no ", kConfigFile, ", so this is not an HF model directory"));
  }
  LlamaWeights w;
  KV_ASSIGN_OR_RETURN(w.config, ParseHfConfig(config_path));
  ModelConfig& c = w.config;
  if (const fs::path gen = d / "generation_config.json"; fs::exists(gen)) {
    KV_RETURN_IF_ERROR(ApplyGenerationConfig(gen.string(), &c));
  }
  const fs::path norm = d.lexically_normal();
  c.name = (norm.has_filename() ? norm.filename() : norm.parent_path().filename()).string();

  auto storage = std::make_shared<HfStorage>();
  KV_ASSIGN_OR_RETURN(TensorSource src, TensorSource::Open(dir, access, storage.get()));

  const int64_t dim = c.dim, hid = c.hidden_dim, vocab = c.vocab_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const std::vector<int64_t> layer_shapes[] = {{dim},         {q_dim, dim}, {kv_dim, dim},
                                               {kv_dim, dim}, {dim, q_dim}, {dim},
                                               {hid, dim},    {hid, dim},   {dim, hid}};
  static_assert(std::size(kHfLayerTensors) == std::size(layer_shapes));

  bool fp8 = false;
  {
    KV_ASSIGN_OR_RETURN(json j, ReadJsonFile(config_path));
    KV_ASSIGN_OR_RETURN(fp8, ParseFp8QuantizationConfig(ConfigReader(config_path, j)));
  }
  // An fp8 checkpoint's linear layers stay e4m3 (shapes only in `w`, their
  // codes and scales in w.quantized); the norms and embeddings are read as usual.
  auto q = fp8 ? std::make_shared<QuantizedLinears>() : nullptr;
  auto is_linear = [](size_t i) { return i != 0 && i != 5; };  // not the two norms
  static constexpr Fp8Matrix QuantizedLinears::Fp8Layer::*kFp8Members[] = {
      nullptr,
      &QuantizedLinears::Fp8Layer::wq,
      &QuantizedLinears::Fp8Layer::wk,
      &QuantizedLinears::Fp8Layer::wv,
      &QuantizedLinears::Fp8Layer::wo,
      nullptr,
      &QuantizedLinears::Fp8Layer::w_gate,
      &QuantizedLinears::Fp8Layer::w_up,
      &QuantizedLinears::Fp8Layer::w_down};
  static_assert(std::size(kFp8Members) == std::size(kHfLayerTensors));

  KV_ASSIGN_OR_RETURN(w.tok_embeddings, src.Get(kHfEmbeddings, {vocab, dim}));
  w.layers.resize(c.num_layers);
  if (q != nullptr) q->fp8_layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    for (size_t i = 0; i < std::size(kHfLayerTensors); ++i) {
      const std::string name = HfLayerTensorName(l, kHfLayerTensors[i].suffix);
      if (q != nullptr && is_linear(i)) {
        if (const std::string dt = src.DtypeOf(name); !dt.empty() && dt != "F8_E4M3") {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor '", name, "' is ", dt,
              " in an fp8 checkpoint (config.json quantization_config): every linear layer "
              "must be F8_E4M3 (only the head may stay in full precision)"));
        }
        KV_ASSIGN_OR_RETURN(q->fp8_layers[l].*kFp8Members[i],
                            src.GetFp8(name, layer_shapes[i].at(0), layer_shapes[i].at(1)));
        (lw.*kHfLayerTensors[i].member).shape = layer_shapes[i];
        q->num_weights += layer_shapes[i].at(0) * layer_shapes[i].at(1);
        continue;
      }
      KV_ASSIGN_OR_RETURN(lw.*kHfLayerTensors[i].member, src.Get(name, layer_shapes[i]));
    }
    if (c.qkv_bias) {
      const int64_t sizes[] = {q_dim, kv_dim, kv_dim};
      for (size_t i = 0; i < std::size(kHfQkvBiasTensors); ++i) {
        KV_ASSIGN_OR_RETURN(lw.*kHfQkvBiasTensors[i].member,
                            src.Get(HfLayerTensorName(l, kHfQkvBiasTensors[i].suffix), {sizes[i]}));
      }
    }
    if (c.o_bias) {
      KV_ASSIGN_OR_RETURN(lw.*kHfOBiasTensor.member,
                          src.Get(HfLayerTensorName(l, kHfOBiasTensor.suffix), {dim}));
    }
    if (c.qk_norm) {
      for (const HfLayerTensor& t : kHfQkNormTensors) {
        KV_ASSIGN_OR_RETURN(lw.*t.member,
                            src.Get(HfLayerTensorName(l, t.suffix), {int64_t{c.head_dim}}));
      }
    }
  }
  KV_ASSIGN_OR_RETURN(w.final_norm, src.Get(kHfFinalNorm, {dim}));
  if (c.tie_word_embeddings) {
    // Some tied checkpoints still carry lm_head.weight; the config decides.
    w.output = w.tok_embeddings;
  } else if (q != nullptr && src.DtypeOf(kHfLmHead) == "F8_E4M3") {
    KV_ASSIGN_OR_RETURN(q->fp8_output, src.GetFp8(kHfLmHead, vocab, dim));
    w.output.shape = {vocab, dim};
  } else {
    KV_ASSIGN_OR_RETURN(w.output, src.Get(kHfLmHead, {vocab, dim}));
  }
  if (q != nullptr) {
    w.weight_quant.body = WeightQuant::kFp8E4m3;
    w.weight_quant.head = q->fp8_output.empty() ? WeightQuant::kNone : WeightQuant::kFp8E4m3;
    w.weight_quant.head_auto = false;
    w.quantized = std::move(q);
  }
  // One file: its fingerprint; shards: the fingerprint of theirs, in order.
  std::vector<uint64_t> shard_prints;
  for (const auto& file : storage->files) {
    shard_prints.push_back(FingerprintBytes(file->file().data(), file->file().size()));
  }
  w.fingerprint =
      FingerprintHex(shard_prints.size() == 1
                         ? shard_prints[0]
                         : FingerprintBytes(reinterpret_cast<const uint8_t*>(shard_prints.data()),
                                            shard_prints.size() * sizeof(uint64_t)));
  w.storage = std::move(storage);
  return w;
}

}  // namespace kvserve
