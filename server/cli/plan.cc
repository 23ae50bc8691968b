// `kvserve plan`: how many tokens and sequences fit in a memory budget per KV
// cache format, for a model given as a preset name or a path. The numbers
// come from cache/sizing/capacity_plan.h (exact page layouts), so they match the
// pools the engine builds. Prints a table; --json also writes it as JSON.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/sizing/capacity_plan.h"
#include "cache/tier/block_value.h"
#include "model/loader/dummy_model.h"
#include "model/loader/hf_loader.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/lowrank/low_rank_kv.h"
#include "model/model_config.h"
#include "server/cli/commands.h"
#include "server/cli/flags.h"
#include "util/byte_size.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve plan --model PRESET_OR_PATH --memory SIZE --context N [options]\n"
    "Plans KV cache capacity for every KV format: bytes per token (all layers, K and V,\n"
    "scales included), the blocks and tokens that fit in --memory after the weights, and\n"
    "how many sequences of --context tokens run at once.\n"
    "options:\n"
    "  --model M           preset (tiny, llama-2-7b, llama-2-70b, llama-3-8b, mistral-7b,\n"
    "                      stories110m-shape, tiny-hd64; 'dummy:' prefix optional), HF\n"
    "                      directory or llama2.c checkpoint\n"
    "  --tokenizer FILE    tokenizer.json or SentencePiece .model of a llama2.c checkpoint\n"
    "                      (default: beside it)\n"
    "  --memory SIZE       memory for weights + KV cache, with its unit (required):\n"
    "                      80GiB or 80Gi (80 x 1024^3), 80GB or 80G (80 x 1000^3), 4096B\n"
    "  --context N         tokens per sequence (required)\n"
    "  --block-size B      KV block size in tokens (default 16)\n"
    "  --batch N           also show what N sequences of --context tokens need (default 0)\n"
    "  --weight-dtype D    weight storage: fp32, fp16, bf16, fp8_e4m3 (or fp8), int8, int4,\n"
    "                      int4_asym (default fp16; int8 / int4 / int4_asym count the CPU\n"
    "                      runner's model.weight_dtype layout, fp8_e4m3 the CUDA runner's:\n"
    "                      e4m3 linear layers with a scale a row, the rest in bf16)\n"
    "  --int4-group-size G channels per int4 scale group (default 64)\n"
    "  --kv-dtype D        also plan D: a dtype or one per layer (int8,int4_kc*,int8: NAME*N\n"
    "                      is N layers, NAME* the layers left); repeatable\n"
    "  --max-seqs N        running sequences (scheduler.max_num_seqs) whose int4_kc/int2_kc\n"
    "                      tails are reserved, two fp16 tail blocks each (default 64)\n"
    "  --host-tier SIZE    also show the tokens a host-memory KV tier of SIZE holds\n"
    "  --disk-tier SIZE    ... a disk tier of SIZE (4 KiB slots and their index)\n"
    "  --remote-tier SIZE  ... a Redis of SIZE (one value per block)\n"
    "  --json FILE         also write the plan as JSON\n"
    "  --low-rank FILE     plan the narrower pages of low-rank KV latents (kvserve\n"
    "                      calibrate-kv's file; int4_kc rows are left out)\n"
    "  --cross-layer L[:T[:R]]  plan cross-layer KV sharing from layer L (retained\n"
    "                      fraction R, default 0.125; the threshold T does not change\n"
    "                      the bytes); int4_kc and int2_kc rows are left out\n"
    "exit status: 0 when at least one KV format holds a sequence of --context tokens,\n"
    "3 when none does, 1 on other errors, 2 on bad flags.\n";

constexpr const char* kTierNames[3] = {"host", "disk", "remote"};

// The exit status when the plan holds no sequence at all.
constexpr int kNothingFits = 3;

struct Options {
  std::string model;
  std::string tokenizer;  // for a llama2.c checkpoint without one beside it
  int64_t memory_bytes = -1;
  int64_t context = 0;
  int64_t tier_bytes[3] = {0, 0, 0};  // host, disk, remote (--host-tier ...)
  int block_size = 16;
  int64_t batch = 0;
  std::string weight_dtype = "fp16";
  double weight_bytes_per_param = 2.0;
  int int4_group_size = 64;
  std::vector<KvDtypeSpec> extra_dtypes;
  std::string low_rank;          // --low-rank FILE
  KvCrossLayerSpec cross_layer;  // --cross-layer
  int64_t max_seqs = 64;
  std::string json_path;
};

bool WeightBytesPerParam(const std::string& dtype, double* bytes) {
  if (dtype == "fp32" || dtype == "float32") {
    *bytes = 4;
  } else if (dtype == "fp16" || dtype == "bf16" || dtype == "float16" || dtype == "bfloat16") {
    *bytes = 2;
  } else if (dtype == "fp8" || dtype == "fp8_e4m3" || dtype == "int8") {
    *bytes = 1;
  } else if (dtype == "int4") {
    *bytes = 0.5;
  } else if (dtype == "int4_asym") {
    *bytes = 0.625;  // 4 bits and an fp16 scale and offset per 32
  } else {
    return false;
  }
  return true;
}

// Returns -1 to go on, or the exit code (0 after --help, 2 on a bad flag).
int ParseFlags(int argc, char** argv, Options* o) {
  CliFlags flags("plan", kUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  ModelFlags m;
  for (const CliFlag& flag : flags.flags()) {
    if (std::optional<int> rc =
            m.Take(flags, flag, kModelFlag | kTokenizerFlag | kKvDtypeFlag | kBlockSizeFlag)) {
      if (*rc >= 0) return *rc;
      continue;
    }
    const std::string& name = flag.name;
    const std::string& value = flag.value;
    auto bad = [&](const std::string& want) { return flags.BadValue(flag, want); };
    int64_t n = 0;
    if (name == "--memory") {
      absl::StatusOr<int64_t> bytes = ParseByteSize(value, "--memory", ByteSizeUnit::kRequired);
      if (!bytes.ok()) return flags.UsageError(std::string(bytes.status().message()));
      o->memory_bytes = *bytes;
    } else if (name == "--context") {
      if (!absl::SimpleAtoi(value, &n) || n < 1) return bad("an integer >= 1");
      o->context = n;
    } else if (name == "--batch") {
      if (!absl::SimpleAtoi(value, &n) || n < 0) return bad("an integer >= 0");
      o->batch = n;
    } else if (name == "--weight-dtype") {
      if (!WeightBytesPerParam(value, &o->weight_bytes_per_param)) {
        return bad("one of fp32, fp16, bf16, fp8_e4m3, int8, int4, int4_asym");
      }
      o->weight_dtype = value;
    } else if (name == "--int4-group-size") {
      if (!absl::SimpleAtoi(value, &n) || n < 2 || n > (1 << 20))
        return bad("an even integer >= 2");
      o->int4_group_size = static_cast<int>(n);
    } else if (name == "--max-seqs") {
      if (!absl::SimpleAtoi(value, &n) || n < 0 || n > (1 << 24)) return bad("an integer >= 0");
      o->max_seqs = n;
    } else if (name == "--host-tier" || name == "--disk-tier" || name == "--remote-tier") {
      absl::StatusOr<int64_t> bytes = ParseByteSize(value, name, ByteSizeUnit::kRequired);
      if (!bytes.ok()) return flags.UsageError(std::string(bytes.status().message()));
      o->tier_bytes[name == "--host-tier" ? 0 : name == "--disk-tier" ? 1 : 2] = *bytes;
    } else if (name == "--json") {
      o->json_path = value;
    } else if (name == "--low-rank") {
      o->low_rank = value;
    } else if (name == "--cross-layer") {
      absl::StatusOr<KvCrossLayerSpec> xl = ParseKvCrossLayer(value, "--cross-layer");
      if (!xl.ok()) return flags.UsageError(std::string(xl.status().message()));
      o->cross_layer = *xl;
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", name, "'"));
    }
  }
  o->model = m.model;
  o->tokenizer = m.tokenizer;
  o->extra_dtypes = m.kv_dtypes;
  o->block_size = m.block_size.value_or(o->block_size);
  if (o->model.empty()) return flags.UsageError("--model is required");
  if (o->memory_bytes < 0) return flags.UsageError("--memory is required");
  if (o->context == 0) return flags.UsageError("--context is required");
  return -1;
}

// Tokens tier t (0 host, 1 disk, 2 remote) of its --*-tier bytes holds in
// format f: whole block values (cache/tier/block_value.h); the disk pads
// each to a 4 KiB slot and keeps a 24-byte index record (disk_tier.h).
int64_t TierTokens(const KvFormatCapacity& f, const Options& o, int t) {
  int64_t value = TierHeaderBytes(o.block_size) + f.block_bytes;
  if (t == 1) value = (value + 4095) / 4096 * 4096 + 24;
  return o.tier_bytes[t] / value * o.block_size;
}

// A preset name (with or without "dummy:"), else an HF directory (its
// config.json only), else anything LoadModel reads.
absl::StatusOr<ModelConfig> ResolveModel(const std::string& model, const std::string& tokenizer) {
  if (absl::StatusOr<ModelConfig> preset = DummyPresetConfig(model); preset.ok()) return preset;
  if (std::ifstream(model + "/config.json").good()) return ParseHfConfig(model + "/config.json");
  absl::StatusOr<LoadedModel> loaded = LoadModel(model, tokenizer);
  if (!loaded.ok()) {
    std::string presets;
    for (const std::string& p : DummyPresetNames()) presets += (presets.empty() ? "" : ", ") + p;
    return absl::Status(loaded.status().code(),
                        absl::StrCat(std::string(loaded.status().message()),
                                     " (and it is not a preset: ", presets, ")"));
  }
  return loaded->weights.config;
}

std::string WithCommas(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace

int RunPlan(int argc, char** argv) {
  Options o;
  if (int rc = ParseFlags(argc, argv, &o); rc >= 0) return rc;
  absl::StatusOr<ModelConfig> config = ResolveModel(o.model, o.tokenizer);
  if (!config.ok()) {
    std::fprintf(stderr, "kvserve plan: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = *config;
  const int64_t params = c.NumParams();
  CapacityPlanRequest req;
  req.num_layers = c.num_layers;
  req.num_kv_heads = c.num_kv_heads;
  req.head_dim = c.head_dim;
  req.weight_bytes = static_cast<int64_t>(static_cast<double>(params) * o.weight_bytes_per_param);
  if (o.weight_dtype == "int8" || o.weight_dtype == "int4" || o.weight_dtype == "int4_asym") {
    // What the CPU runner holds (model.weight_dtype): packed linear layers
    // with their scales, embeddings and norms in fp32, the head per the rule.
    req.weight_bytes = ForwardWeightBytesFor(c, *ParseWeightQuant(o.weight_dtype));
  } else if (o.weight_dtype == "fp8" || o.weight_dtype == "fp8_e4m3") {
    req.weight_bytes = DeviceFp8WeightBytesFor(c, *ParseWeightQuant(o.weight_dtype));
  }
  req.memory_bytes = o.memory_bytes;
  req.context_tokens = o.context;
  req.block_size = o.block_size;
  req.int4_group_size = o.int4_group_size;
  req.batch = o.batch;
  req.max_seqs = o.max_seqs;
  req.dtypes = DefaultPlanDtypes(o.block_size);
  for (const KvDtypeSpec& d : o.extra_dtypes) {
    if (std::find(req.dtypes.begin(), req.dtypes.end(), d) == req.dtypes.end()) {
      req.dtypes.push_back(d);
    }
  }
  if (!o.low_rank.empty()) {
    absl::StatusOr<LowRankKv> lr = LoadLowRankKv(o.low_rank);
    if (lr.ok() && (lr->num_layers != c.num_layers || lr->num_kv_heads != c.num_kv_heads ||
                    lr->head_dim != c.head_dim)) {
      lr = absl::FailedPreconditionError(
          absl::StrCat("low-rank file ", o.low_rank, ": calibrated for another model's shape"));
    }
    if (!lr.ok()) {
      std::fprintf(stderr, "kvserve plan: --low-rank: %s\n",
                   std::string(lr.status().message()).c_str());
      return 1;
    }
    req.layer_dims = LowRankLayerDims(*lr);
    std::printf("low-rank KV latents from %s: pages of %d group(s) x %d values in layer 0\n",
                o.low_rank.c_str(), req.layer_dims[0].num_heads, req.layer_dims[0].head_dim);
  }
  req.cross_layer = o.cross_layer;
  if (o.cross_layer.enabled()) {
    std::printf(
        "cross-layer KV sharing from layer %d: pairs (%d, %d), ... share one direction per token, "
        "%d of %d slots a block kept unmerged (retain %g)\n",
        o.cross_layer.from_layer, o.cross_layer.from_layer, o.cross_layer.from_layer + 1,
        o.cross_layer.RetainSlots(o.block_size), o.block_size, o.cross_layer.retain);
  }
  absl::StatusOr<std::vector<KvFormatCapacity>> plan = PlanCapacity(req);
  if (!plan.ok()) {
    std::fprintf(stderr, "kvserve plan: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  const int64_t budget = plan->front().kv_budget_bytes;

  std::printf("model %s: %d layers, %d heads / %d kv heads, head_dim %d, %s parameters\n",
              c.name.empty() ? o.model.c_str() : c.name.c_str(), c.num_layers, c.num_heads,
              c.num_kv_heads, c.head_dim, WithCommas(params).c_str());
  std::printf("memory %s - weights %s (%s) = KV budget %s\n", FormatBytes(o.memory_bytes).c_str(),
              FormatBytes(req.weight_bytes).c_str(), o.weight_dtype.c_str(),
              FormatBytes(budget).c_str());
  if (req.weight_bytes >= o.memory_bytes) {
    std::printf(
        "the weights alone exceed --memory: nothing fits (more memory or a smaller"
        " --weight-dtype)\n");
  }
  std::printf("context %s tokens = %s blocks of %d tokens per sequence\n\n",
              WithCommas(o.context).c_str(), WithCommas(plan->front().blocks_per_seq).c_str(),
              o.block_size);
  const std::string batch_header =
      o.batch > 0 ? absl::StrCat("  ", o.batch, " x ", o.context, " needs") : "";
  int width = 9;
  for (const KvFormatCapacity& f : *plan) {
    width = std::max(width, static_cast<int>(f.spec.ToString().size()));
  }
  std::printf("%-*s %12s %8s %16s %14s%s\n", width, "kv_dtype", "bytes/token", "vs fp16", "tokens",
              absl::StrCat("seqs@", o.context).c_str(), batch_header.c_str());
  for (const KvFormatCapacity& f : *plan) {
    std::string batch_col;
    if (o.batch > 0) {
      batch_col = absl::StrCat("  ", FormatBytes(f.batch_bytes),
                               f.batch_fits ? "" : ", more than the budget");
    }
    std::printf("%-*s %12s %7.2fx %16s %14s%s\n", width, f.spec.ToString().c_str(),
                WithCommas(f.bytes_per_token).c_str(), f.tokens_vs_fp16,
                WithCommas(f.num_tokens).c_str(), WithCommas(f.max_seqs).c_str(),
                batch_col.c_str());
  }
  std::printf(
      "\nbytes/token: all %d layers, K and V, scales and page padding included (int4 groups of "
      "%d).\n",
      c.num_layers, std::min(o.int4_group_size, c.head_dim));
  for (const KvFormatCapacity& f : *plan) {
    if (f.num_tail_blocks == 0) continue;
    std::printf(
        "%s: %s %s tail blocks (2 x --max-seqs %s running sequences) take %s of the budget; "
        "it holds %.2fx the tokens of fp16 in these bytes, tails included.\n",
        f.spec.ToString().c_str(), WithCommas(f.num_tail_blocks).c_str(),
        o.cross_layer.enabled() ? "fp32" : "fp16", WithCommas(o.max_seqs).c_str(),
        FormatBytes(f.tail_bytes).c_str(), f.tokens_vs_fp16_in_budget);
  }

  const bool tiers = o.tier_bytes[0] > 0 || o.tier_bytes[1] > 0 || o.tier_bytes[2] > 0;
  if (tiers) {
    std::printf(
        "\ntokens per tier (a value per block: a %lld-byte header and token ids, then the block "
        "as stored):\n",
        static_cast<long long>(TierHeaderBytes(o.block_size)));
    std::printf("%-*s", width, "kv_dtype");
    for (int t = 0; t < 3; ++t) {
      if (o.tier_bytes[t] == 0) continue;
      std::printf(" %28s", absl::StrCat(kTierNames[t], " ", FormatBytes(o.tier_bytes[t])).c_str());
    }
    std::printf("\n");
    for (const KvFormatCapacity& f : *plan) {
      std::printf("%-*s", width, f.spec.ToString().c_str());
      for (int t = 0; t < 3; ++t) {
        if (o.tier_bytes[t] > 0) {
          std::printf(" %28s", WithCommas(TierTokens(f, o, t)).c_str());
        }
      }
      std::printf("\n");
    }
  }

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["model"] = {{"name", c.name.empty() ? o.model : c.name},
                  {"num_layers", c.num_layers},
                  {"num_heads", c.num_heads},
                  {"num_kv_heads", c.num_kv_heads},
                  {"head_dim", c.head_dim},
                  {"num_params", params}};
    j["memory_bytes"] = o.memory_bytes;
    j["weight_dtype"] = o.weight_dtype;
    j["weight_bytes"] = req.weight_bytes;
    j["kv_budget_bytes"] = budget;
    j["context"] = o.context;
    j["block_size"] = o.block_size;
    j["batch"] = o.batch;
    j["int4_group_size"] = std::min(o.int4_group_size, c.head_dim);
    j["max_seqs"] = o.max_seqs;
    nlohmann::json formats = nlohmann::json::array();
    for (const KvFormatCapacity& f : *plan) {
      formats.push_back({{"kv_dtype", f.spec.ToString()},
                         {"bytes_per_token", f.bytes_per_token},
                         {"block_bytes", f.block_bytes},
                         {"num_blocks", f.num_blocks},
                         {"num_tokens", f.num_tokens},
                         {"max_seqs", f.max_seqs},
                         {"batch_bytes", f.batch_bytes},
                         {"batch_fits", f.batch_fits},
                         {"tokens_vs_fp16", f.tokens_vs_fp16},
                         {"num_tail_blocks", f.num_tail_blocks},
                         {"tail_bytes", f.tail_bytes},
                         {"tokens_vs_fp16_in_budget", f.tokens_vs_fp16_in_budget}});
      if (tiers) {
        nlohmann::json& t = formats.back()["tier_tokens"];
        for (int i = 0; i < 3; ++i) {
          if (o.tier_bytes[i] > 0) t[kTierNames[i]] = TierTokens(f, o, i);
        }
      }
    }
    j["formats"] = formats;
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "kvserve plan: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  bool any_fits = false;
  for (const KvFormatCapacity& f : *plan) any_fits |= f.max_seqs > 0;
  if (!any_fits) {
    std::fprintf(stderr, "kvserve plan: not one sequence of %lld tokens fits in any KV format\n",
                 static_cast<long long>(o.context));
    return kNothingFits;
  }
  return 0;
}

}  // namespace kvserve::cli
