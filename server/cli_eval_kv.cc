// `kvserve eval-kv`: the KV cache quality report. Runs real text through the
// CPU backend once per KV format (model/kv_quality.h does the work) and
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
#include "absl/strings/str_split.h"
#include "cache/kv_format.h"
#include "model/cpu_model_runner.h"
#include "model/kv_quality.h"
#include "model/model_loader.h"
#include "server/cli.h"
#include "server/cli_flags.h"

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
    "  --tokenizer FILE       SentencePiece .model (default: beside the model)\n"
    "  --text FILE            the text (required)\n"
    "  --kv-dtype D           a format to report: fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4,\n"
    "                         int4_kc, or one per layer (int8,int4_kc*,int8: NAME*N is N\n"
    "                         layers, NAME* the layers left); repeat the flag for several;\n"
    "                         'all' is every dtype and int8,int4_kc*,int8 (default all; fp32\n"
    "                         always runs as the reference)\n"
    "  --block-size B         KV block size in tokens (default 16)\n"
    "  --int4-group-size G    int4 channels per scale group: 32, 64 or 128, clamped to\n"
    "                         head_dim (default 64)\n"
    "  --max-stories N        use the first N stories, 0 = all (default 0)\n"
    "  --context N            truncate stories to N tokens (default: the model's context)\n"
    "  --chunk N              prefill rows per step of the teacher-forced pass (default 64)\n"
    "  --prompts N            greedy prompts: the first tokens of N stories (default 16)\n"
    "  --prompt-tokens N      prompt length in tokens, BOS included (default 16)\n"
    "  --continuation N       greedy tokens per prompt, 0 = skip (default 128)\n"
    "  --threads N            CPU threads per format, 0 = all (default 0)\n"
    "  --json FILE            also write the report as JSON\n";

struct Options {
  std::string model;
  std::string tokenizer;
  std::string text;
  std::vector<KvDtypeSpec> dtypes;  // empty: all
  int block_size = 16;
  int int4_group_size = 64;
  int32_t max_stories = 0;
  int32_t context = 0;
  int threads = 0;
  std::string json;
  KvQualityOptions eval;
};

// 'all': every dtype, then int4_kc with int8 first and last layers.
std::vector<KvDtypeSpec> AllFormats() {
  std::vector<KvDtypeSpec> out(std::begin(kCpuKvDtypes), std::end(kCpuKvDtypes));
  out.push_back(*KvDtypeSpec::Parse("int8,int4_kc*,int8"));
  return out;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvserve eval-kv: %s\n", std::string(s.message()).c_str());
  return 1;
}

// Parses argv (after the subcommand name) into *o. Returns -1 to go on, or
// the exit code (0 after --help, 2 on a bad flag).
int ParseFlags(int argc, char** argv, Options* o) {
  CliFlags flags("eval-kv", kUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  for (const CliFlag& flag : flags.flags()) {
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
    if (name == "--model") {
      o->model = value;
    } else if (name == "--tokenizer") {
      o->tokenizer = value;
    } else if (name == "--text") {
      o->text = value;
    } else if (name == "--json") {
      o->json = value;
    } else if (name == "--kv-dtype") {
      if (value == "all") {
        for (const KvDtypeSpec& d : AllFormats()) o->dtypes.push_back(d);
        continue;
      }
      absl::StatusOr<KvDtypeSpec> d = KvDtypeSpec::Parse(value, "--kv-dtype");
      if (!d.ok()) return flags.UsageError(std::string(d.status().message()));
      o->dtypes.push_back(*d);
    } else if (name == "--block-size") {
      if (!int_flag(1, 65536, &o->block_size)) return bad("an integer in [1, 65536]");
    } else if (name == "--int4-group-size") {
      if (!int_flag(1, 65536, &o->int4_group_size) ||
          (o->int4_group_size != 32 && o->int4_group_size != 64 && o->int4_group_size != 128)) {
        return bad("32, 64 or 128");
      }
    } else if (name == "--max-stories") {
      if (!int_flag(0, 1 << 30, &o->max_stories)) return bad("an integer >= 0");
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
    } else if (name == "--threads") {
      if (!int_flag(0, 1024, &o->threads)) return bad("an integer >= 0");
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", name, "'"));
    }
  }
  if (o->model.empty()) return flags.UsageError("--model is required");
  if (o->text.empty()) return flags.UsageError("--text is required");
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
  const ModelConfig& config = loaded->weights.config;
  const int32_t max_len = opt.context > 0 ? std::min(opt.context, config.max_position_embeddings)
                                          : config.max_position_embeddings;
  const std::vector<std::vector<int32_t>> stories =
      TokenizeStories(text.str(), *loaded->tokenizer, max_len, opt.max_stories);

  for (const KvDtypeSpec& d : opt.dtypes) {
    if (absl::Status s = d.Resolve(config.num_layers, "--kv-dtype").status(); !s.ok()) {
      std::fprintf(stderr, "kvserve eval-kv: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  const LlamaWeights& weights = loaded->weights;
  KvRunnerFactory make_runner =
      [&](const KvDtypeSpec& dtype) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    CpuRunnerOptions ro;
    ro.kv_dtype = dtype;
    ro.block_size = opt.block_size;
    ro.int4_group_size = opt.int4_group_size;
    ro.num_threads = opt.threads;
    absl::StatusOr<std::unique_ptr<CpuModelRunner>> r = CpuModelRunner::Create(weights, ro);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };

  ProgressBar bar;
  if (isatty(STDERR_FILENO)) {
    opt.eval.progress = [&bar](int64_t done, int64_t total) { bar.Update(done, total); };
  }
  opt.eval.dtypes = opt.dtypes.empty() ? AllFormats() : opt.dtypes;
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
