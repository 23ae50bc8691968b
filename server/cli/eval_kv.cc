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
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/eval/eviction_study.h"
#include "model/eval/evictor_training.h"
#include "model/eval/kv_eval.h"
#include "model/eval/kv_frontier.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/lowrank/calibrate/calibrate.h"
#include "model/lowrank/low_rank_kv.h"
#include "server/cli/commands.h"
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

struct Options {
  std::string model;
  std::string tokenizer;
  std::string text;
  std::vector<KvDtypeSpec> dtypes;  // empty: all
  // --weight-dtype: the names as given and their parse.
  std::vector<std::string> weight_dtype_names;
  std::vector<WeightQuantSpec> weight_dtypes;
  int block_size = 16;
  int int4_group_size = 64;
  int32_t max_stories = 0;
  int32_t skip_stories = 0;
  std::vector<std::string> low_rank;          // --low-rank files
  std::vector<KvCrossLayerSpec> cross_layer;  // --cross-layer settings
  int32_t context = 0;
  int threads = 0;
  std::string json;
  KvQualityOptions eval;
  // The eviction study.
  std::vector<EvictionPolicyKind> policies;  // non-empty: the study
  int32_t budget = 256;
  int32_t stream_tokens = 4000;
  int32_t sink_tokens = 4;
  int32_t recent_tokens = 0;
  int32_t window = 0;  // 0: 256, or 128 for the sweep
  bool recompute = true;
  int32_t sweep = 0;
  std::string evictor_model;
  std::string png;
  // The frontier.
  bool frontier = false;
  std::string calibration_text;
  std::vector<double> low_rank_fractions = {0.75, 0.5};
  int32_t streams = 0;
};

// 'all': every dtype, then int4_kc with int8 first and last layers.
std::vector<KvDtypeSpec> AllFormats() {
  std::vector<KvDtypeSpec> out(std::begin(kCpuKvDtypes), std::end(kCpuKvDtypes));
  out.push_back(*KvDtypeSpec::Parse("int8,int4_kc*,int8"));
  return out;
}

// The CPU runner options every eval-kv runner shares (num_blocks 0: the
// runner's default pool).
CpuRunnerOptions RunnerOptionsFor(const Options& opt, const KvDtypeSpec& dtype,
                                  int32_t num_blocks = 0) {
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

// "\r[#########           ]  45%" on stderr, redrawn only when the percent changes.
class ProgressBar {
 public:
  void Update(int64_t done, int64_t total) {
    const int percent = total > 0 ? static_cast<int>(done * 100 / total) : 100;
    if (percent == last_percent_) return;
    last_percent_ = percent;
    constexpr int kWidth = 40;
    const int filled = percent * kWidth / 100;
    std::fprintf(stderr, "\r[%s%s] %3d%%", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), percent);
    std::fflush(stderr);
  }
  void Finish() {
    if (last_percent_ >= 0) std::fputc('\n', stderr);
  }

 private:
  int last_percent_ = -1;
};

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

// The eviction study (--policy): long text, or the budget sweep.
int RunStudy(const Options& opt, const LoadedModel& loaded, const std::string& text) {
  const ModelConfig& config = loaded.weights.config;
  std::vector<KvDtypeSpec> dtypes = opt.dtypes;
  if (dtypes.empty()) dtypes = {KvDtype::kFp32, KvDtype::kInt8};
  StudyRunnerFactory make_runner =
      [&](const KvDtypeSpec& dtype,
          int32_t num_blocks) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    const CpuRunnerOptions ro = RunnerOptionsFor(opt, dtype, num_blocks);
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(loaded.weights, ro);
    if (!r.ok()) return r.status();
    if (!(*r)->supports_eviction()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-dtype ", dtype.ToString(),
                                                     ": KV eviction needs a format without tails"));
    }
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };
  const int32_t ctx = config.max_position_embeddings;
  const bool learned = std::find(opt.policies.begin(), opt.policies.end(),
                                 EvictionPolicyKind::kLearned) != opt.policies.end();
  // Streams of the model's context, BOS first, from the joined text after
  // its first `skip` tokens: the sweep's, and the learned predictor's
  // training streams (taken past what the study reads).
  auto context_streams = [&](int32_t count,
                             int32_t skip) -> absl::StatusOr<std::vector<std::vector<int32_t>>> {
    const int32_t body = ctx - 1;
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> all,
                        BuildTokenStream(text, *loaded.tokenizer, 1 + skip + body * count));
    std::vector<std::vector<int32_t>> out;
    for (int32_t k = 0; k < count; ++k) {
      std::vector<int32_t> s = {config.bos_id};
      const size_t first = 1 + static_cast<size_t>(skip) + static_cast<size_t>(k) * body;
      s.insert(s.end(), all.begin() + first, all.begin() + first + body);
      out.push_back(std::move(s));
    }
    return out;
  };
  std::shared_ptr<const EvictorModel> evictor;
  if (learned) {
    if (!opt.evictor_model.empty()) {
      absl::StatusOr<EvictorModel> m = EvictorModel::Load(opt.evictor_model);
      if (!m.ok()) return Fail(m.status());
      evictor = std::make_shared<const EvictorModel>(*m);
    } else {
      std::fprintf(stderr, "kvserve eval-kv: training the learned evictor on 8 streams...\n");
      const int32_t skip = std::max(opt.stream_tokens, opt.sweep * (ctx - 1));
      absl::StatusOr<std::vector<std::vector<int32_t>>> train = context_streams(8, skip);
      if (!train.ok()) return Fail(train.status());
      absl::StatusOr<std::unique_ptr<ModelRunner>> r =
          make_runner(KvDtype::kFp32, BlocksForTokens(ctx, opt.block_size) + 1);
      if (!r.ok()) return Fail(r.status());
      absl::StatusOr<EvictorTrainingResult> t = TrainEvictor(*train, **r, {});
      if (!t.ok()) return Fail(t.status());
      evictor = std::make_shared<const EvictorModel>(t->model);
    }
  }
  ProgressBar bar;
  std::function<void(int64_t, int64_t)> progress;
  if (isatty(STDERR_FILENO)) {
    progress = [&bar](int64_t done, int64_t total) { bar.Update(done, total); };
  }
  absl::StatusOr<EvictionStudyReport> report;
  if (opt.sweep > 0) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> streams = context_streams(opt.sweep, 0);
    if (!streams.ok()) return Fail(streams.status());
    BudgetSweepOptions so;
    so.policies = opt.policies;
    so.dtype = dtypes[0];
    so.window = opt.window > 0 ? opt.window : 128;
    so.sink_tokens = opt.sink_tokens;
    so.learned = evictor;
    so.progress = progress;
    report = RunBudgetSweep(*streams, make_runner, so);
  } else {
    absl::StatusOr<std::vector<int32_t>> stream =
        BuildTokenStream(text, *loaded.tokenizer, opt.stream_tokens);
    if (!stream.ok()) return Fail(stream.status());
    EvictionStudyOptions so;
    so.policies = opt.policies;
    so.dtypes = dtypes;
    so.budget = opt.budget;
    so.sink_tokens = opt.sink_tokens;
    so.recent_tokens = opt.recent_tokens;
    so.window = opt.window > 0 ? opt.window : 256;
    so.recompute = opt.recompute;
    so.learned = evictor;
    so.progress = progress;
    report = RunLongTextStudy(*stream, make_runner, so);
  }
  bar.Finish();
  if (!report.ok()) return Fail(report.status());
  report->model = opt.model;
  report->text = opt.text;
  if (report->kind == "sweep") {
    std::printf(
        "KV eviction budget sweep: %s on %s, %d streams of %d tokens (BOS first), "
        "KV %s, block size %d\n\n",
        opt.model.c_str(), opt.text.c_str(), opt.sweep, ctx, dtypes[0].ToString().c_str(),
        report->block_size);
  } else {
    std::printf(
        "KV eviction on long text: %s on %s, one stream of %d tokens (one BOS), budget "
        "%d, block size %d; the model was trained on %d positions\n\n",
        opt.model.c_str(), opt.text.c_str(), opt.stream_tokens, opt.budget, report->block_size,
        ctx);
  }
  std::fputs(EvictionStudyTable(*report).c_str(), stdout);
  std::printf("\n%.1f s\n", report->seconds);
  std::fflush(stdout);
  if (!opt.json.empty() && !WriteFile(opt.json, EvictionStudyJson(*report), "--json")) return 1;
  if (!opt.png.empty() && !Plot(EvictionStudyGnuplot(*report, dtypes[0].ToString(), opt.png))) {
    return 1;
  }
  return 0;
}

// Streams of `length` tokens, one story each (BOS and the story's first
// length - 1 tokens), from the stories of `text` at least that long; at most
// max_count (0: all). One story a stream, so that eviction is measured on a
// context that hangs together, not on the end of one story and the start of
// the next (evicting an earlier story helps there).
std::vector<std::vector<int32_t>> StoryStreams(const std::string& text, const Tokenizer& tok,
                                               int32_t length, int32_t max_count) {
  std::vector<std::vector<int32_t>> out;
  for (std::vector<int32_t>& s : TokenizeStories(text, tok, length)) {
    if (max_count > 0 && static_cast<int32_t>(out.size()) == max_count) break;
    if (static_cast<int32_t>(s.size()) == length) out.push_back(std::move(s));
  }
  return out;
}

// The compression frontier (--frontier).
constexpr int32_t kFrontierStreamTokens = 256;

int RunFrontierCommand(const Options& opt, const LoadedModel& loaded, const std::string& text) {
  const ModelConfig& config = loaded.weights.config;
  std::ifstream cin(opt.calibration_text, std::ios::binary);
  if (!cin) {
    return Fail(
        absl::NotFoundError(absl::StrCat("cannot read --calibration-text ", opt.calibration_text)));
  }
  std::stringstream calibration;
  calibration << cin.rdbuf();
  const int32_t length = std::min(opt.context > 0 ? opt.context : kFrontierStreamTokens,
                                  config.max_position_embeddings);
  const std::vector<std::vector<int32_t>> streams =
      StoryStreams(text, *loaded.tokenizer, length, opt.streams);
  if (streams.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--text has no story of ", length, " tokens (--context)")));
  }
  std::vector<EvictionPolicyKind> policies = opt.policies;
  if (policies.empty()) {
    policies = {EvictionPolicyKind::kStreaming, EvictionPolicyKind::kH2o,
                EvictionPolicyKind::kLearned};
  }
  policies.erase(std::remove(policies.begin(), policies.end(), EvictionPolicyKind::kNone),
                 policies.end());

  // Low-rank bases at 75% and 50% of a layer's kv width (one group of every
  // kv head, K and V alike), calibrated on the calibration text's stories.
  std::vector<std::pair<double, std::shared_ptr<const LowRankKv>>> bases;
  if (!opt.low_rank_fractions.empty()) {
    const std::vector<std::vector<int32_t>> cal_stories =
        TokenizeStories(calibration.str(), *loaded.tokenizer, config.max_position_embeddings, 0);
    const int32_t width = config.num_kv_heads * config.head_dim;
    for (double f : opt.low_rank_fractions) {
      LowRankCalibrationOptions co;
      co.rank_k = co.rank_v = std::max(1, static_cast<int32_t>(std::lround(f * width)));
      co.num_threads = opt.threads;
      std::fprintf(stderr, "kvserve eval-kv: calibrating low-rank KV at rank %d of %d on %s...\n",
                   co.rank_k, width, opt.calibration_text.c_str());
      absl::StatusOr<LowRankCalibration> cal = CalibrateLowRankKv(loaded.weights, cal_stories, co);
      if (!cal.ok()) return Fail(cal.status());
      bases.emplace_back(f, std::make_shared<const LowRankKv>(std::move(cal->kv)));
    }
  }
  FrontierRunnerFactory make_runner =
      [&](const FrontierCombo& combo,
          int32_t num_blocks) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    CpuRunnerOptions ro = RunnerOptionsFor(opt, combo.kv_dtype, num_blocks);
    if (combo.cross_layer >= 0) {
      ro.cross_layer.from_layer = combo.cross_layer;
      ro.cross_layer.threshold = combo.cross_threshold;
    }
    for (const auto& [f, kv] : bases) {
      if (f == combo.low_rank) ro.low_rank = kv;
    }
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(loaded.weights, ro);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };

  FrontierOptions fo;
  fo.policies = policies;
  if (std::find(policies.begin(), policies.end(), EvictionPolicyKind::kLearned) != policies.end()) {
    if (!opt.evictor_model.empty()) {
      absl::StatusOr<EvictorModel> m = EvictorModel::Load(opt.evictor_model);
      if (!m.ok()) return Fail(m.status());
      fo.learned = std::make_shared<const EvictorModel>(*m);
    } else {
      const std::vector<std::vector<int32_t>> train =
          StoryStreams(calibration.str(), *loaded.tokenizer, length, 0);
      if (train.empty()) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("--calibration-text has no story of ", length,
                         " tokens (the learned evictor trains on its stories)")));
      }
      std::fprintf(stderr,
                   "kvserve eval-kv: training the learned evictor on %zu streams of %s...\n",
                   train.size(), opt.calibration_text.c_str());
      FrontierCombo fp32{"fp32"};
      absl::StatusOr<std::unique_ptr<ModelRunner>> r =
          make_runner(fp32, BlocksForTokens(length, opt.block_size) + 1);
      if (!r.ok()) return Fail(r.status());
      absl::StatusOr<EvictorTrainingResult> t = TrainEvictor(train, **r, {});
      if (!t.ok()) return Fail(t.status());
      fo.learned = std::make_shared<const EvictorModel>(t->model);
    }
  }
  // Every format; eviction on the formats without tails that the study
  // already reports (fp32 and int8); low-rank and cross-layer points.
  std::vector<KvDtypeSpec> formats = opt.dtypes.empty() ? AllFormats() : opt.dtypes;
  fo.combos.push_back({"fp32", KvDtype::kFp32, 0, -1, true});
  for (const KvDtypeSpec& d : formats) {
    const std::string name = d.ToString();
    if (name == "fp32") continue;
    fo.combos.push_back({name, d, 0, -1, name == "int8"});
  }
  // Low-rank latents in the per-token formats that store them best.
  for (const auto& [f, kv] : bases) {
    for (KvDtype d : {KvDtype::kFp32, KvDtype::kFp16, KvDtype::kInt8}) {
      const KvDtypeSpec spec = d;
      fo.combos.push_back(
          {absl::StrFormat("%s+lr%.0f%%", spec.ToString(), 100 * f), spec, f, -1, false});
    }
  }
  // Cross-layer sharing from the middle layer on (retain 0.125), in fp32
  // and int8 pages, at two thresholds.
  for (KvDtype d : {KvDtype::kFp32, KvDtype::kInt8}) {
    for (double t : {0.3, 0.7}) {
      const KvDtypeSpec spec = d;
      FrontierCombo c{absl::StrFormat("%s+xl%d@%g", spec.ToString(), config.num_layers / 2, t),
                      spec, 0, config.num_layers / 2, false};
      c.cross_threshold = t;
      fo.combos.push_back(c);
    }
  }
  KvLayerShape shape;
  shape.num_layers = config.num_layers;
  shape.num_kv_heads = config.num_kv_heads;
  shape.head_dim = config.head_dim;
  shape.block_size = opt.block_size;
  shape.int4_group_size = opt.int4_group_size;
  absl::StatusOr<KvLayers> fp16 = ResolveKvLayers(KvDtype::kFp16, shape);
  if (!fp16.ok()) return Fail(fp16.status());
  fo.fp16_bytes_per_token = static_cast<double>(fp16->bytes_per_block) / opt.block_size;
  ProgressBar bar;
  if (isatty(STDERR_FILENO)) {
    fo.progress = [&bar](int64_t done, int64_t total) { bar.Update(done, total); };
  }
  absl::StatusOr<FrontierReport> report = RunFrontier(streams, make_runner, fo);
  bar.Finish();
  if (!report.ok()) return Fail(report.status());
  report->model = opt.model;
  report->text = opt.text;
  report->calibration_text = opt.calibration_text;
  std::printf(
      "KV compression frontier: %s on %s (held out; calibration: %s)\n"
      "%d streams of %d tokens (BOS first), block size %d; reference: fp32 dense, ppl %.4f\n\n",
      opt.model.c_str(), opt.text.c_str(), opt.calibration_text.c_str(), report->num_streams,
      report->stream_tokens, report->block_size, report->reference_ppl);
  std::fputs(FrontierTable(*report).c_str(), stdout);
  std::printf("\n%.1f s\n", report->seconds);
  std::fflush(stdout);
  if (!opt.json.empty() && !WriteFile(opt.json, FrontierJson(*report), "--json")) return 1;
  if (!opt.png.empty() && !Plot(FrontierGnuplot(*report, opt.png))) return 1;
  return 0;
}

}  // namespace

int RunEvalKv(int argc, char** argv) {
  Options opt;
  if (int rc = ParseFlags(argc, argv, &opt); rc >= 0) return rc;

  std::ifstream in(opt.text, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read --text ", opt.text)));
  std::stringstream text;
  text << in.rdbuf();

  absl::StatusOr<LoadedModel> loaded = LoadModel(opt.model, opt.tokenizer);
  if (!loaded.ok()) return Fail(loaded.status());
  if (opt.frontier) return RunFrontierCommand(opt, *loaded, text.str());
  if (!opt.policies.empty()) return RunStudy(opt, *loaded, text.str());
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
