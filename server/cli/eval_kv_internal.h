// What the files of `kvserve eval-kv` share: eval_kv.cc (flags and the KV
// quality report), eval_kv_study.cc (the eviction study, --policy) and
// eval_kv_frontier.cc (the compression frontier, --frontier).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cache/eviction/eviction_params.h"
#include "cache/format/kv_cross_layer.h"
#include "cache/format/kv_dtype_spec.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/eval/kv_eval.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"

namespace kvserve::cli::eval_kv {

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
std::vector<KvDtypeSpec> AllFormats();
// The CPU runner options every eval-kv runner shares (num_blocks 0: the
// runner's default pool).
CpuRunnerOptions RunnerOptionsFor(const Options& opt, const KvDtypeSpec& dtype,
                                  int32_t num_blocks = 0);
// Prints "kvserve eval-kv: MESSAGE" to stderr; returns the exit code 1.
int Fail(const absl::Status& s);
// Writes `body` to `path`; false with a message on failure.
bool WriteFile(const std::string& path, const std::string& body, const char* flag);
// Plots with gnuplot (the script is fed on stdin).
bool Plot(const std::string& script);

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

// The eviction study (--policy): long text, or the budget sweep.
int RunStudy(const Options& opt, const LoadedModel& loaded, const std::string& text);
// The compression frontier (--frontier).
int RunFrontierCommand(const Options& opt, const LoadedModel& loaded, const std::string& text);

}  // namespace kvserve::cli::eval_kv
