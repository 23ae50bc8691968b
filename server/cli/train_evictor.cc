// `kvserve train-evictor`: trains the predictor of the `learned` KV eviction
// policy (cache/eviction/learned_evictor.h) on a model's attention over real text
// (model/eval/evictor_training.h) and writes it for cache.evictor_model.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/eval/eviction_study.h"
#include "model/eval/evictor_training.h"
#include "model/loader/model_loader.h"
#include "server/cli/commands.h"
#include "server/cli/flags.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve train-evictor --model PATH --text FILE --out FILE [options]\n"
    "Trains the predictor of the learned KV eviction policy: the stories of the text,\n"
    "joined into streams of the model's context (BOS first), are fed one token per step;\n"
    "for sampled cache entries, attention features now predict whether the entry gets at\n"
    "least average attention over the next steps (logistic regression). Use the file as\n"
    "cache.evictor_model (or eval-kv --evictor-model).\n"
    "options:\n"
    "  --model PATH       llama2.c checkpoint or HF directory (required)\n"
    "  --tokenizer FILE   tokenizer.json or SentencePiece .model (default: beside the model)\n"
    "  --text FILE        the text (required)\n"
    "  --out FILE         where to write the model (required)\n"
    "  --streams N        streams to record (default 16)\n"
    "  --skip-tokens N    start after this many tokens of the text (default 0)\n"
    "  --horizon N        steps ahead an entry must be needed (default 16)\n"
    "  --samples N        entries sampled per step (default 32)\n"
    "  --threads N        CPU threads, 0 = all (default 0)\n";

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvserve train-evictor: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunTrainEvictor(int argc, char** argv) {
  CliFlags flags("train-evictor", kUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  std::string model, tokenizer, text_path, out;
  int32_t streams = 16, skip = 0;
  int threads = 0;
  EvictorTrainingOptions to;
  ModelFlags m;
  for (const CliFlag& flag : flags.flags()) {
    if (std::optional<int> rc = m.Take(flags, flag, kModelFlag | kTokenizerFlag | kThreadsFlag)) {
      if (*rc >= 0) return *rc;
      continue;
    }
    long long n = 0;
    auto int_flag = [&](long long lo, long long hi, auto* dst) {
      if (!CliFlags::ParseInt(flag.value, lo, hi, &n)) return false;
      *dst = static_cast<std::remove_pointer_t<decltype(dst)>>(n);
      return true;
    };
    if (flag.name == "--text") {
      text_path = flag.value;
    } else if (flag.name == "--out") {
      out = flag.value;
    } else if (flag.name == "--streams") {
      if (!int_flag(1, 1 << 16, &streams)) return flags.BadValue(flag, "an integer >= 1");
    } else if (flag.name == "--skip-tokens") {
      if (!int_flag(0, 1 << 30, &skip)) return flags.BadValue(flag, "an integer >= 0");
    } else if (flag.name == "--horizon") {
      if (!int_flag(1, 1 << 16, &to.horizon)) return flags.BadValue(flag, "an integer >= 1");
    } else if (flag.name == "--samples") {
      if (!int_flag(1, 1 << 16, &to.samples_per_step)) {
        return flags.BadValue(flag, "an integer >= 1");
      }
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", flag.name, "'"));
    }
  }
  model = m.model;
  tokenizer = m.tokenizer;
  threads = m.threads.value_or(threads);
  if (model.empty()) return flags.UsageError("--model is required");
  if (text_path.empty()) return flags.UsageError("--text is required");
  if (out.empty()) return flags.UsageError("--out is required");

  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read --text ", text_path)));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<LoadedModel> loaded = LoadModel(model, tokenizer);
  if (!loaded.ok()) return Fail(loaded.status());
  const ModelConfig& c = loaded->weights.config;
  const int32_t body = c.max_position_embeddings - 1;
  absl::StatusOr<std::vector<int32_t>> all =
      BuildTokenStream(text.str(), *loaded->tokenizer, 1 + skip + body * streams);
  if (!all.ok()) return Fail(all.status());
  std::vector<std::vector<int32_t>> data;
  for (int32_t k = 0; k < streams; ++k) {
    std::vector<int32_t> s = {c.bos_id};
    const size_t first = 1 + static_cast<size_t>(skip) + static_cast<size_t>(k) * body;
    s.insert(s.end(), all->begin() + first, all->begin() + first + body);
    data.push_back(std::move(s));
  }
  CpuRunnerOptions ro;
  ro.num_threads = threads;
  absl::StatusOr<std::unique_ptr<CpuModelRunner>> runner =
      CpuModelRunner::Create(loaded->weights, ro);
  if (!runner.ok()) return Fail(runner.status());
  if (isatty(STDERR_FILENO)) {
    to.progress = [last = -1](int64_t done, int64_t total) mutable {
      const int percent = static_cast<int>(done * 100 / std::max<int64_t>(total, 1));
      if (percent == last) return;
      last = percent;
      std::fprintf(stderr, "\r%3d%%", percent);
      if (done == total) std::fputc('\n', stderr);
    };
  }
  absl::StatusOr<EvictorTrainingResult> r = TrainEvictor(data, **runner, to);
  if (!r.ok()) return Fail(r.status());
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file << r->model.Serialize();
  file.close();
  if (!file) return Fail(absl::InternalError(absl::StrCat("cannot write --out ", out)));
  std::printf(
      "trained on %lld examples from %d streams of %d tokens (%.1f%% needed in the next "
      "%d steps); training accuracy %.1f%%\nweights:",
      static_cast<long long>(r->examples), streams, body + 1, 100 * r->positive_rate, to.horizon,
      100 * r->train_accuracy);
  for (int k = 0; k < kEvictorFeatures; ++k) {
    std::printf(" %s %+.3f", kEvictorFeatureNames[k], r->model.weights[k]);
  }
  std::printf(", bias %+.3f\nwrote %s\n", r->model.bias, out.c_str());
  return 0;
}

}  // namespace kvserve::cli
