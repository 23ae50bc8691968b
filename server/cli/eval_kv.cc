// `kvserve eval-kv`: the KV cache quality report, and with --policy the KV
// eviction study (model/eval/eviction_study.h). Runs real text through the
// CPU backend once per KV format (model/eval/kv_eval.h does the work) and
// prints, per format, KV bytes per token, perplexity and its change against
// the fp32 cache, mean KL divergence and top-1 agreement with fp32, and the
// mean greedy-continuation agreement length; optionally writes JSON. A
// progress bar goes to stderr when stderr is a terminal.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/eval/kv_eval.h"
#include "model/eval/kv_frontier.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/lowrank/low_rank_kv.h"
#include "server/cli/commands.h"
#include "server/cli/eval_kv_internal.h"
#include "server/cli/flags.h"
#include "util/status_macros.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve eval-kv --model PATH --text FILE [options]\n"
    "KV cache quality per format on real text: each story (stories are separated by\n"
    "'<|endoftext|>' lines; each is BOS + its tokens) is fed through the paged cache of\n"
    "every format on the CPU; the fp32 cache is the reference. Prints a table, and JSON\n"
    "with --json.\n"
    "options:\n"
    "  --model PATH           llama2.c checkpoint, HF directory or dummy:<preset> (required)\n"
    "  --tokenizer FILE       tokenizer.json or SentencePiece .model (default: beside the model)\n"
    "  --text FILE            the text (required)\n"
    "  --kv-dtype D           a format to report: fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4,\n"
    "                         int4_kc, int2_kc, or one per layer (int8,int4_kc*,int8: NAME*N\n"
    "                         is N layers, NAME* the layers left); repeat the flag for several;\n"
    "                         'all' is every dtype and int8,int4_kc*,int8 (default all; fp32\n"
    "                         always runs as the reference)\n"
    "  --weight-dtype D       instead: weight dtypes to report (int8, int4, int4_asym,\n"
    "                         int8+head int8, int4/g128, ...), repeatable; fp32 weights are\n"
    "                         the reference and the KV\n"
    "                         cache stays fp32\n"
    "  --block-size B         KV block size in tokens (default 16)\n"
    "  --int4-group-size G    int4 channels per scale group: 32, 64 or 128, clamped to\n"
    "                         head_dim (default 64)\n"
    "  --low-rank FILE        also rows with low-rank KV latents (kvserve calibrate-kv's\n"
    "                         file), one per --kv-dtype given (fp32 alone when none);\n"
    "                         repeatable\n"
    "  --cross-layer L[:T[:R]]  also rows with cross-layer KV sharing from layer L\n"
    "                         (threshold T, angle / pi, default 0.1; retained fraction R,\n"
    "                         default 0.125), one per --kv-dtype given (fp32 alone when\n"
    "                         none); repeatable\n"
    "  --max-stories N        use the first N stories, 0 = all (default 0)\n"
    "  --skip-stories N       skip the first N stories (e.g. those calibrate-kv saw)\n"
    "  --context N            truncate stories to N tokens (default: the model's context)\n"
    "  --chunk N              prefill rows per step of the teacher-forced pass (default 64)\n"
    "  --prompts N            greedy prompts: the first tokens of N stories (default 16)\n"
    "  --prompt-tokens N      prompt length in tokens, BOS included (default 16)\n"
    "  --continuation N       greedy tokens per prompt, 0 = skip (default 128)\n"
    "  --threads N            CPU threads per format, 0 = all (default 0)\n"
    "  --json FILE            also write the report as JSON\n"
    "KV eviction study (with --policy): the stories joined by newlines into one stream\n"
    "with a single BOS, teacher-forced under each policy; perplexity per window, against\n"
    "dense attention (none) and the recompute baseline; --kv-dtype defaults to fp32 and\n"
    "int8 there.\n"
    "  --policy LIST          'all' or a comma list of none, sliding_window, streaming, h2o,\n"
    "                         scissorhands, learned\n"
    "  --budget N             KV entries a sequence keeps (default 256)\n"
    "  --stream-tokens N      stream length (default 4000)\n"
    "  --sink-tokens N        streaming's sinks (default 4; a 0-sink run is added)\n"
    "  --recent-tokens N      h2o, scissorhands, learned: recent tokens kept (default budget/2)\n"
    "  --window N             positions per perplexity window (default 256; sweep 128)\n"
    "  --recompute yes|no     run the recompute baseline (default yes)\n"
    "  --sweep N              instead: the budget sweep over N streams of the model's context\n"
    "                         (10/20/30/50/70% budgets against none)\n"
    "  --evictor-model FILE   for learned (default: trained here on 8 streams of the text\n"
    "                         past what the study reads)\n"
    "  --png FILE             also plot perplexity (gnuplot), one line per run\n"
    "KV compression frontier (with --frontier): stories from --text (held out) through\n"
    "every format, eviction at 20/30/50/70% budgets (fp32, int8) and low-rank latents at\n"
    "75% and 50% of the kv width (calibrated on --calibration-text; fp32, fp16, int8\n"
    "pages) and cross-layer sharing from the middle layer at thresholds 0.3 and 0.7\n"
    "(fp32, int8 pages); bytes per token\n"
    "against the change in perplexity from the fp32 dense cache, the Pareto front\n"
    "marked (*). --json writes the points, --png plots them (gnuplot); --policy picks\n"
    "the policies (default streaming,h2o,learned).\n"
    "  --frontier             run the frontier\n"
    "  --calibration-text FILE  what the frontier calibrates on (the low-rank bases, and\n"
    "                         the learned evictor is trained on it); required with --frontier\n"
    "  --streams N            held-out streams, 0 = as many as --text holds (default 0): one\n"
    "                         story each, its first --context tokens (default 256), from the\n"
    "                         stories at least that long\n";

}  // namespace

namespace eval_kv {

// 'all': every dtype, then int4_kc with int8 first and last layers.
std::vector<KvDtypeSpec> AllFormats() {
  std::vector<KvDtypeSpec> out(std::begin(kCpuKvDtypes), std::end(kCpuKvDtypes));
  out.push_back(*KvDtypeSpec::Parse("int8,int4_kc*,int8"));
  return out;
}

// The CPU runner options every eval-kv runner shares (num_blocks 0: the
// runner's default pool).
CpuRunnerOptions RunnerOptionsFor(const Options& opt, const KvDtypeSpec& dtype,
                                  int32_t num_blocks) {
  CpuRunnerOptions ro;
  ro.kv_dtype = dtype;
  ro.block_size = opt.block_size;
  ro.int4_group_size = opt.int4_group_size;
  ro.num_threads = opt.threads;
  ro.num_blocks = num_blocks;
  return ro;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvserve eval-kv: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace eval_kv

namespace {

using eval_kv::AllFormats;
using eval_kv::Fail;
using eval_kv::Options;
using eval_kv::ProgressBar;
using eval_kv::RunnerOptionsFor;

// Parses argv (after the subcommand name) into *o. Returns -1 to go on, or
// the exit code (0 after --help, 2 on a bad flag).
int ParseFlags(int argc, char** argv, Options* o) {
  CliFlags flags("eval-kv", kUsage, {"--frontier"});
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  ModelFlags m;
  for (const CliFlag& flag : flags.flags()) {
    if (flag.name == "--kv-dtype" && flag.value == "all") {
      for (const KvDtypeSpec& d : AllFormats()) o->dtypes.push_back(d);
      continue;
    }
    if (std::optional<int> rc = m.Take(flags, flag,
                                       kModelFlag | kTokenizerFlag | kKvDtypeFlag | kBlockSizeFlag |
                                           kThreadsFlag | kWeightDtypeFlag)) {
      if (*rc >= 0) return *rc;
      if (flag.name == "--weight-dtype") {
        if (m.weight_dtypes.back().fp8()) {
          return flags.UsageError(
              "--weight-dtype: model.weight_dtype: fp8_e4m3 weights run on CUDA only; eval-kv "
              "runs the CPU runner (int8, int4, int4_asym)");
        }
        o->weight_dtype_names.push_back(m.weight_dtype_names.back());
        o->weight_dtypes.push_back(m.weight_dtypes.back());
      }
      // Formats keep their order among 'all' and single ones.
      if (flag.name == "--kv-dtype") o->dtypes.push_back(m.kv_dtypes.back());
      continue;
    }
    const std::string& name = flag.name;
    const std::string& value = flag.value;
    int64_t n = 0;
    // Reads an integer flag in [lo, hi] into *dst.
    auto int_flag = [&](int64_t lo, int64_t hi, auto* dst) -> bool {
      if (!absl::SimpleAtoi(value, &n) || n < lo || n > hi) return false;
      *dst = static_cast<std::remove_pointer_t<decltype(dst)>>(n);
      return true;
    };
    auto bad = [&](const std::string& want) { return flags.BadValue(flag, want); };
    if (name == "--text") {
      o->text = value;
    } else if (name == "--json") {
      o->json = value;
    } else if (name == "--int4-group-size") {
      if (!int_flag(1, 65536, &o->int4_group_size) ||
          (o->int4_group_size != 32 && o->int4_group_size != 64 && o->int4_group_size != 128)) {
        return bad("32, 64 or 128");
      }
    } else if (name == "--max-stories") {
      if (!int_flag(0, 1 << 30, &o->max_stories)) return bad("an integer >= 0");
    } else if (name == "--skip-stories") {
      if (!int_flag(0, 1 << 30, &o->skip_stories)) return bad("an integer >= 0");
    } else if (name == "--low-rank") {
      o->low_rank.push_back(value);
    } else if (name == "--cross-layer") {
      absl::StatusOr<KvCrossLayerSpec> xl = ParseKvCrossLayer(value, "--cross-layer");
      if (!xl.ok()) return flags.UsageError(std::string(xl.status().message()));
      o->cross_layer.push_back(*xl);
    } else if (name == "--context") {
      if (!int_flag(2, 1 << 30, &o->context)) return bad("an integer >= 2");
    } else if (name == "--chunk") {
      if (!int_flag(1, 1 << 20, &o->eval.chunk_tokens)) return bad("an integer >= 1");
    } else if (name == "--prompts") {
      if (!int_flag(0, 1 << 20, &o->eval.num_prompts)) return bad("an integer >= 0");
    } else if (name == "--prompt-tokens") {
      if (!int_flag(1, 1 << 20, &o->eval.prompt_tokens)) return bad("an integer >= 1");
    } else if (name == "--continuation") {
      if (!int_flag(0, 1 << 20, &o->eval.continuation)) return bad("an integer >= 0");
    } else if (name == "--policy") {
      o->policies.clear();
      if (value == "all") {
        o->policies.assign(std::begin(kAllEvictionPolicies), std::end(kAllEvictionPolicies));
        continue;
      }
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        absl::StatusOr<EvictionPolicyKind> k = ParseEvictionPolicy(std::string(part), "--policy");
        if (!k.ok()) return flags.UsageError(std::string(k.status().message()));
        if (std::find(o->policies.begin(), o->policies.end(), *k) == o->policies.end()) {
          o->policies.push_back(*k);
        }
      }
      if (o->policies.empty()) return bad("'all' or a list of policies");
    } else if (name == "--budget") {
      if (!int_flag(2, 1 << 24, &o->budget)) return bad("an integer >= 2");
    } else if (name == "--stream-tokens") {
      if (!int_flag(2, 1 << 24, &o->stream_tokens)) return bad("an integer >= 2");
    } else if (name == "--sink-tokens") {
      if (!int_flag(0, 1 << 20, &o->sink_tokens)) return bad("an integer >= 0");
    } else if (name == "--recent-tokens") {
      if (!int_flag(0, 1 << 24, &o->recent_tokens)) return bad("an integer >= 0");
    } else if (name == "--window") {
      if (!int_flag(1, 1 << 24, &o->window)) return bad("an integer >= 1");
    } else if (name == "--recompute") {
      if (value != "yes" && value != "no") return bad("yes or no");
      o->recompute = value == "yes";
    } else if (name == "--sweep") {
      if (!int_flag(1, 1 << 16, &o->sweep)) return bad("a number of streams >= 1");
    } else if (name == "--evictor-model") {
      o->evictor_model = value;
    } else if (name == "--png") {
      o->png = value;
    } else if (name == "--frontier") {
      o->frontier = true;
    } else if (name == "--calibration-text") {
      o->calibration_text = value;
    } else if (name == "--streams") {
      if (!int_flag(0, 1 << 20, &o->streams)) return bad("an integer >= 0");
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", name, "'"));
    }
  }
  o->model = m.model;
  o->tokenizer = m.tokenizer;
  o->block_size = m.block_size.value_or(o->block_size);
  o->threads = m.threads.value_or(o->threads);
  if (o->model.empty()) return flags.UsageError("--model is required");
  if (o->text.empty()) return flags.UsageError("--text is required");
  if (o->sweep > 0 && o->policies.empty()) {
    return flags.UsageError("--sweep needs --policy (the policies to sweep)");
  }
  if (o->frontier && o->calibration_text.empty()) {
    return flags.UsageError("--frontier needs --calibration-text");
  }
  if (o->frontier && o->sweep > 0)
    return flags.UsageError("--frontier and --sweep exclude each other");
  return -1;
}

}  // namespace

namespace eval_kv {

// Writes `body` to `path`; false with a message on failure.
bool WriteFile(const std::string& path, const std::string& body, const char* flag) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << body;
  out.close();
  if (!out) {
    Fail(absl::InternalError(absl::StrCat("cannot write ", flag, " ", path)));
    return false;
  }
  return true;
}

// Plots with gnuplot (the script is fed on stdin).
bool Plot(const std::string& script) {
  FILE* p = popen("gnuplot", "w");
  if (p == nullptr) {
    Fail(absl::UnavailableError("cannot run gnuplot for --png (Debian: gnuplot-nox)"));
    return false;
  }
  std::fputs(script.c_str(), p);
  if (pclose(p) != 0) {
    Fail(absl::InternalError("gnuplot failed to draw --png (Debian: gnuplot-nox)"));
    return false;
  }
  return true;
}

}  // namespace eval_kv

int RunEvalKv(int argc, char** argv) {
  Options opt;
  if (int rc = ParseFlags(argc, argv, &opt); rc >= 0) return rc;

  std::ifstream in(opt.text, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read --text ", opt.text)));
  std::stringstream text;
  text << in.rdbuf();

  absl::StatusOr<LoadedModel> loaded = LoadModel(opt.model, opt.tokenizer);
  if (!loaded.ok()) return Fail(loaded.status());
  if (opt.frontier) return eval_kv::RunFrontierCommand(opt, *loaded, text.str());
  if (!opt.policies.empty()) return eval_kv::RunStudy(opt, *loaded, text.str());
  const ModelConfig& config = loaded->weights.config;
  const int32_t max_len = opt.context > 0 ? std::min(opt.context, config.max_position_embeddings)
                                          : config.max_position_embeddings;
  std::vector<std::vector<int32_t>> stories =
      TokenizeStories(text.str(), *loaded->tokenizer, max_len,
                      opt.max_stories > 0 ? opt.max_stories + opt.skip_stories : 0);
  stories.erase(stories.begin(),
                stories.begin() + std::min<size_t>(stories.size(), opt.skip_stories));

  for (const KvDtypeSpec& d : opt.dtypes) {
    if (absl::Status s = d.Resolve(config.num_layers, "--kv-dtype").status(); !s.ok()) {
      std::fprintf(stderr, "kvserve eval-kv: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  const LlamaWeights& weights = loaded->weights;
  KvRunnerFactory make_runner =
      [&](const KvDtypeSpec& dtype) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    const CpuRunnerOptions ro = RunnerOptionsFor(opt, dtype);
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(weights, ro);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };

  ProgressBar bar;
  if (isatty(STDERR_FILENO)) {
    opt.eval.progress = [&bar](int64_t done, int64_t total) { bar.Update(done, total); };
  }
  // With --low-rank or --cross-layer alone: the fp32 reference and their rows.
  opt.eval.dtypes = !opt.dtypes.empty()                               ? opt.dtypes
                    : opt.low_rank.empty() && opt.cross_layer.empty() ? AllFormats()
                                                                      : std::vector<KvDtypeSpec>{};
  opt.eval.low_rank = opt.low_rank;
  opt.eval.cross_layer = opt.cross_layer;
  opt.eval.make_cross_layer_runner =
      [&](const KvDtypeSpec& dtype,
          const KvCrossLayerSpec& xl) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    CpuRunnerOptions ro = RunnerOptionsFor(opt, dtype);
    ro.cross_layer = xl;
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(weights, ro);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };
  opt.eval.make_low_rank_runner =
      [&](const KvDtypeSpec& dtype,
          const std::string& file) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    absl::StatusOr<LowRankKv> lr = LoadLowRankKvFor(file, weights);
    if (!lr.ok()) {
      return absl::Status(lr.status().code(),
                          absl::StrCat("--low-rank: ", std::string(lr.status().message())));
    }
    CpuRunnerOptions ro = RunnerOptionsFor(opt, dtype);
    ro.low_rank = std::make_shared<const LowRankKv>(*std::move(lr));
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(weights, ro);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };
  opt.eval.weight_dtypes = opt.weight_dtype_names;
  opt.eval.make_weight_runner =
      [&](const std::string& name) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    LlamaWeights w = weights;
    for (size_t i = 0; i < opt.weight_dtype_names.size(); ++i) {
      if (opt.weight_dtype_names[i] != name) continue;
      absl::Status s = QuantizeWeights(opt.weight_dtypes[i], &w, opt.threads);
      if (!s.ok()) return s;
      break;
    }
    CpuRunnerOptions ro;
    ro.kv_dtype = KvDtype::kFp32;
    ro.block_size = opt.block_size;
    ro.num_threads = opt.threads;
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(std::move(w), ro);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };
  opt.eval.int4_group_size = opt.int4_group_size;
  absl::StatusOr<KvQualityReport> report = EvaluateKvQuality(stories, make_runner, opt.eval);
  bar.Finish();
  if (!report.ok()) return Fail(report.status());
  report->model = opt.model;
  report->text = opt.text;

  std::printf(
      "KV cache quality: %s on %s\n"
      "%d stories, %lld next-token predictions (teacher forcing through the paged cache, "
      "block size %d)\n"
      "greedy agreement: %d prompts of %d tokens, up to %d tokens each; reference: fp32 cache\n\n",
      opt.model.c_str(), opt.text.c_str(), report->num_stories,
      static_cast<long long>(report->num_predictions), report->block_size, report->num_prompts,
      report->prompt_tokens, report->continuation);
  std::fputs(KvQualityTable(*report).c_str(), stdout);
  std::printf("\n%.1f s\n", report->seconds);
  std::fflush(stdout);

  if (!opt.json.empty()) {
    std::ofstream out(opt.json, std::ios::binary | std::ios::trunc);
    out << KvQualityJson(*report);
    out.close();
    if (!out) return Fail(absl::InternalError(absl::StrCat("cannot write --json ", opt.json)));
  }
  return 0;
}

}  // namespace kvserve::cli
