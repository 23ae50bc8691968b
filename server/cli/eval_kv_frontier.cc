// `kvserve eval-kv --frontier`: bytes per token against the change in
// perplexity over formats, eviction, low-rank and cross-layer KV
// (model/eval/kv_frontier.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "model/eval/eviction_study.h"
#include "model/eval/evictor_training.h"
#include "model/eval/kv_frontier.h"
#include "model/lowrank/calibrate/calibrate.h"
#include "model/lowrank/low_rank_kv.h"
#include "server/cli/eval_kv_internal.h"
#include "util/status_macros.h"

namespace kvserve::cli::eval_kv {

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

}  // namespace kvserve::cli::eval_kv
