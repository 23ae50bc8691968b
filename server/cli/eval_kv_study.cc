// `kvserve eval-kv --policy`: the KV eviction study (model/eval/eviction_study.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "model/eval/eviction_study.h"
#include "model/eval/evictor_training.h"
#include "server/cli/eval_kv_internal.h"
#include "util/status_macros.h"

namespace kvserve::cli::eval_kv {

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

}  // namespace kvserve::cli::eval_kv
