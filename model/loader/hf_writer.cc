#include "model/loader/hf_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "model/loader/hf_loader.h"
#include "model/loader/quantize_weights.h"
#include "util/status_macros.h"

namespace kvserve {
namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace {

// Moves whole rows: dst row to_row(r) = src row r, within each head.
template <typename ToRow>
std::vector<float> MoveRows(const Tensor& w, int num_heads, int head_dim, ToRow to_row) {
  const int64_t rows = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t cols = w.shape.size() == 2 ? w.shape[1] : 0;
  if (w.shape.size() != 2 || w.shape[0] != rows || head_dim % 2 != 0) {
    std::fprintf(stderr,
                 "kvserve: rope row permutation of a [%lld x %lld] tensor with %d heads "
                 "of %d\n",
                 static_cast<long long>(w.shape.empty() ? 0 : w.shape[0]),
                 static_cast<long long>(cols), num_heads, head_dim);
    std::abort();
  }
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      for (int j = 0; j < 2; ++j) {
        const int64_t interleaved = static_cast<int64_t>(h) * head_dim + 2 * i + j;
        const int64_t rotate_half = static_cast<int64_t>(h) * head_dim + j * half + i;
        const auto [src, dst] = to_row(interleaved, rotate_half);
        std::memcpy(out.data() + dst * cols, w.data + src * cols, cols * sizeof(float));
      }
    }
  }
  return out;
}

// The shortest decimal that reads back as `v`, so config.json says 1e-05
// rather than 9.999999747378752e-06.
double ShortestDecimal(float v) {
  for (int precision = 6; precision < 9; ++precision) {
    const double d = std::stod(absl::StrFormat("%.*g", precision, v));
    if (static_cast<float>(d) == v) return d;
  }
  return std::stod(absl::StrFormat("%.9g", v));
}

const char* TorchDtype(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "float32";
    case SafetensorsDtype::kF16:
      return "float16";
    case SafetensorsDtype::kBF16:
      return "bfloat16";
  }
  return "?";
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

ordered_json HfConfigJson(const ModelConfig& c, SafetensorsDtype dtype) {
  ordered_json j;
  j["architectures"] = {c.architecture.empty() ? "LlamaForCausalLM" : c.architecture};
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  j["model_type"] = c.architecture == "MistralForCausalLM" ? "mistral"
                    : qwen2                                ? "qwen2"
                    : c.architecture == "Qwen3ForCausalLM" ? "qwen3"
                                                           : "llama";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["vocab_size"] = c.vocab_size;
  j["rms_norm_eps"] = ShortestDecimal(c.rms_norm_eps);
  j["rope_theta"] = ShortestDecimal(c.rope_theta);
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScalingType::kNone) {
    ordered_json s;
    s["rope_type"] = rs.type == RopeScalingType::kLinear    ? "linear"
                     : rs.type == RopeScalingType::kDynamic ? "dynamic"
                                                            : "llama3";
    s["factor"] = ShortestDecimal(rs.factor);
    if (rs.type == RopeScalingType::kLlama3) {
      s["low_freq_factor"] = ShortestDecimal(rs.low_freq_factor);
      s["high_freq_factor"] = ShortestDecimal(rs.high_freq_factor);
    }
    if (rs.original_max_position_embeddings > 0) {
      s["original_max_position_embeddings"] = rs.original_max_position_embeddings;
    }
    j["rope_scaling"] = s;
  }
  // Qwen2 implies q/k/v biases; elsewhere attention_bias puts one on q/k/v/o.
  if (!qwen2) j["attention_bias"] = c.o_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  j["torch_dtype"] = TorchDtype(dtype);
  // Read by kvserve's HF loader only: BOS ends a TinyStories story.
  if (c.bos_is_stop) j["kvserve_bos_is_stop"] = true;
  return j;
}

// Opens `path` and writes a safetensors header: its length, then the JSON,
// padded with spaces (valid JSON) so that the data section, and with it
// every F32 tensor, starts aligned; readers can then use F32 data in place.
absl::Status OpenWithHeader(const std::string& path, const ordered_json& header,
                            std::ofstream* out) {
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  out->open(path, std::ios::binary | std::ios::trunc);
  if (!*out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  const uint64_t header_len = text.size();
  out->write(reinterpret_cast<const char*>(&header_len), 8);
  out->write(text.data(), static_cast<std::streamsize>(text.size()));
  return absl::OkStatus();
}

}  // namespace

std::vector<float> PermuteRowsForRotateHalf(const Tensor& w, int num_heads, int head_dim) {
  return MoveRows(w, num_heads, head_dim, [](int64_t interleaved, int64_t rotate_half) {
    return std::pair{interleaved, rotate_half};
  });
}

std::vector<float> UnpermuteRowsFromRotateHalf(const Tensor& w, int num_heads, int head_dim) {
  return MoveRows(w, num_heads, head_dim, [](int64_t interleaved, int64_t rotate_half) {
    return std::pair{rotate_half, interleaved};
  });
}

absl::Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                              SafetensorsDtype dtype,
                              const std::map<std::string, std::string>& metadata) {
  const size_t elem = SafetensorsDtypeBytes(dtype);
  ordered_json header;
  ordered_json meta = {{"format", "pt"}};
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.tensor.numel()) * elem;
    header[t.name] = {{"dtype", SafetensorsDtypeName(dtype)},
                      {"shape", t.tensor.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::ofstream out;
  KV_RETURN_IF_ERROR(OpenWithHeader(path, header, &out));
  std::vector<uint16_t> narrow;
  for (const NamedTensor& t : tensors) {
    const size_t n = static_cast<size_t>(t.tensor.numel());
    if (dtype == SafetensorsDtype::kF32) {
      out.write(reinterpret_cast<const char*>(t.tensor.data),
                static_cast<std::streamsize>(n * sizeof(float)));
      continue;
    }
    narrow.resize(n);
    for (size_t i = 0; i < n; ++i) {
      narrow[i] = dtype == SafetensorsDtype::kF16 ? Fp32ToFp16(t.tensor.data[i])
                                                  : Fp32ToBf16(t.tensor.data[i]);
    }
    out.write(reinterpret_cast<const char*>(narrow.data()),
              static_cast<std::streamsize>(n * sizeof(uint16_t)));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status WriteHfDirectory(const LlamaWeights& w, const std::string& tokenizer_path,
                              const std::string& out_dir, SafetensorsDtype dtype) {
  const ModelConfig& c = w.config;
  KV_RETURN_IF_ERROR(c.Validate());
  if (!fs::is_regular_file(tokenizer_path)) {
    return absl::NotFoundError(absl::StrCat(tokenizer_path, ": tokenizer file not found"));
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(out_dir, ": ", ec.message()));
  const fs::path dir(out_dir);
  if (c.rope_style == RopeStyle::kInterleaved && (c.qkv_bias || c.qk_norm)) {
    return absl::UnimplementedError(
        "writing q/k biases or q/k norms of an interleaved-RoPE model (their channels would need "
        "the rotate-half permutation too)");
  }
  if (c.architecture != "Qwen2ForCausalLM" && c.qkv_bias != c.o_bias) {
    return absl::InvalidArgumentError(
        "config.json can only say attention_bias for all of q/k/v/o (Qwen2: q/k/v only)");
  }

  // Permuted copies must outlive the write; a deque keeps them in place.
  std::deque<std::vector<float>> permuted;
  auto rope_rows = [&](const Tensor& t, int heads) {
    if (c.rope_style == RopeStyle::kNeox) return t;  // already rotate-half
    permuted.push_back(PermuteRowsForRotateHalf(t, heads, c.head_dim));
    return Tensor{permuted.back().data(), t.shape};
  };
  std::vector<NamedTensor> tensors;
  tensors.push_back({kHfEmbeddings, w.tok_embeddings});
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& layer = w.layers[l];
    for (const HfLayerTensor& lt : kHfLayerTensors) {
      Tensor t = layer.*lt.member;
      if (lt.member == &LayerWeights::wq) t = rope_rows(t, c.num_heads);
      if (lt.member == &LayerWeights::wk) t = rope_rows(t, c.num_kv_heads);
      tensors.push_back({HfLayerTensorName(l, lt.suffix), t});
    }
    if (c.qkv_bias) {
      for (const HfLayerTensor& lt : kHfQkvBiasTensors) {
        tensors.push_back({HfLayerTensorName(l, lt.suffix), layer.*lt.member});
      }
    }
    if (c.o_bias) {
      tensors.push_back(
          {HfLayerTensorName(l, kHfOBiasTensor.suffix), layer.*kHfOBiasTensor.member});
    }
    if (c.qk_norm) {
      for (const HfLayerTensor& lt : kHfQkNormTensors) {
        tensors.push_back({HfLayerTensorName(l, lt.suffix), layer.*lt.member});
      }
    }
  }
  tensors.push_back({kHfFinalNorm, w.final_norm});
  if (!c.tie_word_embeddings) tensors.push_back({kHfLmHead, w.output});
  KV_RETURN_IF_ERROR(WriteSafetensors((dir / "model.safetensors").string(), tensors, dtype));

  ModelConfig hf = c;
  hf.rope_style = RopeStyle::kNeox;
  KV_RETURN_IF_ERROR(
      WriteText((dir / "config.json").string(), HfConfigJson(hf, dtype).dump(2) + "\n"));
  ordered_json gen;
  gen["_from_model_config"] = true;
  gen["bos_token_id"] = c.bos_id;
  // For a BOS-is-stop model, transformers' generate() stops at BOS too.
  if (c.bos_is_stop) {
    gen["eos_token_id"] = {c.eos_id, c.bos_id};
  } else {
    gen["eos_token_id"] = c.eos_id;
  }
  KV_RETURN_IF_ERROR(WriteText((dir / "generation_config.json").string(), gen.dump(2) + "\n"));

  // The copy takes the source's permissions; a read-only tokenizer (as in a
  // shared model store) must not make the next conversion into `dir` fail.
  const fs::path tok = dir / "tokenizer.model";
  fs::remove(tok, ec);
  fs::copy_file(tokenizer_path, tok, ec);
  if (!ec) fs::permissions(tok, fs::perms::owner_write, fs::perm_options::add, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("copying ", tokenizer_path, " to ", tok.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensorsRaw(const std::string& path, std::span<const RawTensor> tensors) {
  ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::ofstream out;
  KV_RETURN_IF_ERROR(OpenWithHeader(path, header, &out));
  for (const RawTensor& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status WriteHfFp8Directory(const LlamaWeights& w, const std::string& tokenizer_path,
                                 const std::string& out_dir, const Fp8CheckpointOptions& options) {
  // The fp32 directory first, read back: its tensors are the HF ones
  // (wq / wk rows permuted for rotate-half RoPE), which are then rewritten.
  KV_RETURN_IF_ERROR(WriteHfDirectory(w, tokenizer_path, out_dir, SafetensorsDtype::kF32));
  const fs::path dir(out_dir);
  KV_ASSIGN_OR_RETURN(LlamaWeights hf, LoadHfDirectory(out_dir));
  const ModelConfig& c = hf.config;
  std::vector<RawTensor> tensors;
  auto fp32 = [&](const std::string& name, const Tensor& t) {
    RawTensor r{name, "F32", t.shape, {}};
    r.bytes.resize(static_cast<size_t>(t.numel()) * 4);
    std::memcpy(r.bytes.data(), t.data, r.bytes.size());
    tensors.push_back(std::move(r));
  };
  auto fp8 = [&](const std::string& name, const Tensor& t) {
    const int64_t rows = t.shape.at(0), cols = t.shape.at(1);
    Fp8Matrix m = Fp8Matrix::Quantize(t.data, rows, cols);
    if (options.per_tensor) {
      const float scale = *std::max_element(m.scales.begin(), m.scales.end());
      for (int64_t i = 0; i < rows * cols; ++i) {
        m.codes[static_cast<size_t>(i)] =
            scale > 0.0f ? cpu::FloatToFp8E4m3(t.data[i] / scale) : uint8_t{0};
      }
      m.scales.assign(1, scale);
    }
    tensors.push_back({name, "F8_E4M3", t.shape, m.codes});
    RawTensor s{name + "_scale", "F32", {}, {}};
    if (!options.per_tensor) s.shape = {rows, 1};
    s.bytes.resize(m.scales.size() * 4);
    std::memcpy(s.bytes.data(), m.scales.data(), s.bytes.size());
    tensors.push_back(std::move(s));
  };
  fp32(kHfEmbeddings, hf.tok_embeddings);
  for (int l = 0; l < c.num_layers; ++l) {
    for (size_t i = 0; i < std::size(kHfLayerTensors); ++i) {
      const Tensor& t = hf.layers[l].*kHfLayerTensors[i].member;
      const std::string name = HfLayerTensorName(l, kHfLayerTensors[i].suffix);
      if (t.shape.size() == 2) {
        fp8(name, t);
      } else {
        fp32(name, t);
      }
    }
  }
  fp32(kHfFinalNorm, hf.final_norm);
  if (!c.tie_word_embeddings && options.fp8_head) fp8(kHfLmHead, hf.output);
  if (!c.tie_word_embeddings && !options.fp8_head) fp32(kHfLmHead, hf.output);
  if (c.qkv_bias || c.o_bias || c.qk_norm) {
    return absl::UnimplementedError("WriteHfFp8Directory: biases and q/k norms are not written");
  }
  KV_RETURN_IF_ERROR(WriteSafetensorsRaw((dir / "model.safetensors").string(), tensors));

  const std::string config_path = (dir / "config.json").string();
  std::ifstream in(config_path);
  ordered_json config = ordered_json::parse(in);
  if (options.per_tensor) {
    config["quantization_config"] = {
        {"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"}};
  } else {
    ordered_json ignore = ordered_json::array();
    if (!options.fp8_head) ignore.push_back("lm_head");
    config["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"ignore", ignore},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights",
             {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true}}},
            {"input_activations",
             {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}}}}}}};
  }
  return WriteText(config_path, config.dump(2) + "\n");
}

}  // namespace kvserve
