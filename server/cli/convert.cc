// `kvserve convert`: writes a llama2.c checkpoint as a Hugging Face directory
// (config.json, model.safetensors, generation_config.json, tokenizer.model),
// then loads the result back through the HF loader to prove it reads.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "model/loader/hf_loader.h"
#include "model/loader/hf_writer.h"
#include "model/loader/llama2c_loader.h"
#include "server/cli/commands.h"
#include "server/cli/flags.h"

namespace kvserve::cli {
namespace {

constexpr char kConvertUsage[] =
    "usage: kvserve convert --llama2c CKPT --tokenizer TOK --out DIR [--dtype f32|f16|bf16]\n"
    "Writes the llama2.c checkpoint CKPT as a Hugging Face model directory DIR:\n"
    "config.json, model.safetensors (wq/wk rows permuted for rotate-half RoPE),\n"
    "generation_config.json and tokenizer.model (a copy of TOK). --dtype: f32 (default).\n";

}  // namespace

int RunConvert(int argc, char** argv) {
  std::string ckpt, tokenizer, out, dtype_name = "f32";
  CliFlags flags("convert", kConvertUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  for (const CliFlag& flag : flags.flags()) {
    if (flag.name == "--llama2c") {
      ckpt = flag.value;
    } else if (flag.name == "--tokenizer") {
      tokenizer = flag.value;
    } else if (flag.name == "--out") {
      out = flag.value;
    } else if (flag.name == "--dtype") {
      dtype_name = flag.value;
    } else {
      return flags.UsageError("unknown flag '" + flag.name + "'");
    }
  }
  if (ckpt.empty()) return flags.UsageError("--llama2c is required");
  if (tokenizer.empty()) return flags.UsageError("--tokenizer is required");
  if (out.empty()) return flags.UsageError("--out is required");
  SafetensorsDtype dtype;
  if (dtype_name == "f32") {
    dtype = SafetensorsDtype::kF32;
  } else if (dtype_name == "f16") {
    dtype = SafetensorsDtype::kF16;
  } else if (dtype_name == "bf16") {
    dtype = SafetensorsDtype::kBF16;
  } else {
    return flags.UsageError("--dtype must be f32, f16 or bf16, not '" + dtype_name + "'");
  }

  auto weights = LoadLlama2cCheckpoint(ckpt);
  if (!weights.ok()) {
    std::fprintf(stderr, "kvserve convert: %s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = WriteHfDirectory(*weights, tokenizer, out, dtype); !s.ok()) {
    std::fprintf(stderr, "kvserve convert: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto check = LoadHfDirectory(out);
  if (!check.ok()) {
    std::fprintf(stderr, "kvserve convert: wrote %s but it does not load back: %s\n", out.c_str(),
                 std::string(check.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = weights->config;
  std::error_code ec;
  const auto bytes =
      std::filesystem::file_size(std::filesystem::path(out) / "model.safetensors", ec);
  std::fprintf(stderr,
               "kvserve convert: wrote %s (%s, %lld parameters, %d layers, dim %d, %d/%d heads, "
               "model.safetensors %s: %llu bytes)\n",
               out.c_str(), c.name.c_str(), static_cast<long long>(c.NumParams()), c.num_layers,
               c.dim, c.num_heads, c.num_kv_heads, SafetensorsDtypeName(dtype),
               static_cast<unsigned long long>(ec ? 0 : bytes));
  return 0;
}

}  // namespace kvserve::cli
