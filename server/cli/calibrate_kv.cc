// `kvserve calibrate-kv`: the low-rank KV bases (model/lowrank/calibrate/
// calibrate.h) of a model from its activations on text, written as the
// versioned file cache.low_rank and eval-kv --low-rank read
// (model/lowrank/low_rank_kv.h; docs/kv-low-rank.md).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/eval/kv_eval.h"
#include "model/loader/model_loader.h"
#include "model/lowrank/calibrate/calibrate.h"
#include "server/cli/commands.h"
#include "server/cli/flags.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve calibrate-kv --model PATH --text FILE --rank-k R --rank-v R --out FILE\n"
    "Low-rank KV bases (Palu, training-free): each story of the text (stories are\n"
    "separated by '<|endoftext|>' lines) runs through the model; per layer and group of kv\n"
    "heads, the top eigenvectors of the pre-RoPE K and of the V activations' second moment\n"
    "become the bases, and the cache stores rank-R latents (cache.low_rank: FILE, eval-kv\n"
    "--low-rank FILE). Write the file beside the model: it holds the model's fingerprint.\n"
    "options:\n"
    "  --model PATH         llama2.c checkpoint or HF directory (required)\n"
    "  --tokenizer FILE     tokenizer.json or SentencePiece .model (default: beside the model)\n"
    "  --text FILE          calibration text (required)\n"
    "  --out FILE           where to write the bases (required)\n"
    "  --rank-k R           K latent width per group, 1 .. the group's kv width\n"
    "  --rank-v R           V latent width per group (the cache stores the larger of the\n"
    "                       two per layer, so equal ranks use the bytes best)\n"
    "  --error-budget E     instead: per layer the smallest ranks that drop at most this\n"
    "                       share of the activations' energy (e.g. 0.02); --rank-k and\n"
    "                       --rank-v then cap them\n"
    "  --group-heads G      kv heads per latent group (default: all of a layer's)\n"
    "  --center yes|no      subtract the activations' mean before the PCA and keep it in\n"
    "                       the file (default yes)\n"
    "  --weighting W        pca: plain PCA of K and V (default); attention: K's error\n"
    "                       weighted by the queries, V's by the output projection\n"
    "  --max-stories N      calibrate on the first N stories, 0 = all (default 0)\n"
    "  --threads N          CPU threads, 0 = all (default 0)\n";

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvserve calibrate-kv: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunCalibrateKv(int argc, char** argv) {
  CliFlags flags("calibrate-kv", kUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  std::string text_path, out;
  int32_t max_stories = 0;
  LowRankCalibrationOptions co;
  ModelFlags m;
  for (const CliFlag& flag : flags.flags()) {
    if (std::optional<int> rc = m.Take(flags, flag, kModelFlag | kTokenizerFlag | kThreadsFlag)) {
      if (*rc >= 0) return *rc;
      continue;
    }
    long long n = 0;
    if (flag.name == "--text") {
      text_path = flag.value;
    } else if (flag.name == "--out") {
      out = flag.value;
    } else if (flag.name == "--rank-k" || flag.name == "--rank-v") {
      if (!CliFlags::ParseInt(flag.value, 1, 1 << 20, &n))
        return flags.BadValue(flag, "a rank >= 1");
      (flag.name == "--rank-k" ? co.rank_k : co.rank_v) = static_cast<int32_t>(n);
    } else if (flag.name == "--error-budget") {
      double e = 0;
      if (!absl::SimpleAtod(flag.value, &e) || !(e > 0 && e < 1)) {
        return flags.BadValue(flag, "a share in (0, 1)");
      }
      co.error_budget = e;
    } else if (flag.name == "--weighting") {
      if (flag.value != "attention" && flag.value != "pca")
        return flags.BadValue(flag, "attention or pca");
      co.weighted = flag.value == "attention";
    } else if (flag.name == "--center") {
      if (flag.value != "yes" && flag.value != "no") return flags.BadValue(flag, "yes or no");
      co.center = flag.value == "yes";
    } else if (flag.name == "--group-heads") {
      if (!CliFlags::ParseInt(flag.value, 1, 1 << 16, &n))
        return flags.BadValue(flag, "an integer >= 1");
      co.group_heads = static_cast<int32_t>(n);
    } else if (flag.name == "--max-stories") {
      if (!CliFlags::ParseInt(flag.value, 0, 1 << 30, &n))
        return flags.BadValue(flag, "an integer >= 0");
      max_stories = static_cast<int32_t>(n);
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", flag.name, "'"));
    }
  }
  if (m.model.empty()) return flags.UsageError("--model is required");
  if (text_path.empty()) return flags.UsageError("--text is required");
  if (out.empty()) return flags.UsageError("--out is required");
  if (co.error_budget <= 0 && (co.rank_k == 0 || co.rank_v == 0)) {
    return flags.UsageError("--rank-k and --rank-v are required (or --error-budget)");
  }
  co.num_threads = m.threads.value_or(0);

  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read --text ", text_path)));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<LoadedModel> loaded = LoadModel(m.model, m.tokenizer);
  if (!loaded.ok()) return Fail(loaded.status());
  const ModelConfig& c = loaded->weights.config;
  const std::vector<std::vector<int32_t>> stories =
      TokenizeStories(text.str(), *loaded->tokenizer, c.max_position_embeddings, max_stories);
  absl::StatusOr<LowRankCalibration> cal = CalibrateLowRankKv(loaded->weights, stories, co);
  if (!cal.ok()) return Fail(cal.status());
  if (absl::Status s = SaveLowRankKv(cal->kv, out); !s.ok()) return Fail(s);
  const int width = cal->kv.group_width();
  std::printf("calibrated on %zu stories, %lld tokens; %d groups of %d kv heads (width %d)\n",
              stories.size(), static_cast<long long>(cal->tokens), cal->kv.num_groups(),
              cal->kv.group_heads, width);
  std::printf("layer  rank_k  K energy kept  rank_v  V energy kept  stored width\n");
  for (int l = 0; l < cal->kv.num_layers; ++l) {
    const LowRankLayer& lr = cal->kv.layers[l];
    std::printf("%5d  %6d  %12.4f%%  %6d  %12.4f%%  %12d\n", l, lr.rank_k,
                cal->k_energy_kept[l] * 100, lr.rank_v, cal->v_energy_kept[l] * 100,
                lr.stored_width());
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace kvserve::cli
