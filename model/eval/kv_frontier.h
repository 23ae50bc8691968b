// The KV compression frontier behind `kvserve eval-kv --frontier`: the ways
// kvserve has to make the KV cache smaller (formats, eviction budgets,
// low-rank projection, cross-layer sharing) and their combinations, each run
// over the same held-out token streams, one point each of KV bytes per
// token against the change in perplexity from the fp32 dense cache, with the
// Pareto front marked (no other point is both smaller and better).
//
// Every point comes from the real paged path: a combination is a runner (the
// caller's factory makes it: a KV format, a low-rank basis, a cross-layer
// setting), and the streams are teacher-forced through it by the eviction
// study's budget sweep (eviction_study.h): dense attention, and for a
// combination that allows eviction, every policy at every budget fraction.
// The first combination is the reference (fp32, dense) and must be dense.
//
// Bytes per token: the runner's KV bytes per block over all layers (scales
// and page padding included, as the pool allocates them) divided by the
// block size; an evicting point keeps `budget` of a stream's n tokens, so
// its figure is scaled by budget / n (what the cache holds at the stream's
// end per token of context).
//
// Thread-safety: none; drives the runners it makes from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/learned_evictor.h"
#include "cache/format/kv_dtype_spec.h"
#include "model/model_runner.h"

namespace kvserve {

// One way of storing the cache (a runner), before eviction.
struct FrontierCombo {
  std::string name;                       // e.g. "int4_kc", "fp16+lr50%"
  KvDtypeSpec kv_dtype = KvDtype::kFp32;  // one dtype or one per layer
  double low_rank = 0;                    // kept fraction of the kv width; 0: off
  int32_t cross_layer = -1;               // first merged layer; -1: off
  bool evict = false;                     // also run every policy at every budget
  double cross_threshold = 0;             // cross_layer's threshold (angle / pi)
};

struct FrontierPoint {
  std::string name;  // the combo's name, "@ policy budget%" for evicting points
  FrontierCombo combo;
  std::string policy = "none";
  int32_t budget = 0;  // entries kept (0: dense)
  double bytes_per_token = 0;
  double ppl = 0;
  double delta_ppl_percent = 0;  // against the reference
  bool pareto = false;
};

struct FrontierReport {
  // Filled by the caller, for the JSON.
  std::string model;
  std::string text;
  std::string calibration_text;
  int32_t num_streams = 0;
  int32_t stream_tokens = 0;
  int32_t block_size = 0;
  double reference_ppl = 0;  // the first combo, dense
  double fp16_bytes_per_token = 0;
  double seconds = 0;
  std::vector<FrontierPoint> points;  // combos in order, each dense first
};

// Makes the runner of one combo, holding at least num_blocks blocks.
using FrontierRunnerFactory = std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(
    const FrontierCombo& combo, int32_t num_blocks)>;

struct FrontierOptions {
  std::vector<FrontierCombo> combos;  // the reference (fp32, dense) first
  std::vector<EvictionPolicyKind> policies;
  std::vector<double> fractions = {0.2, 0.3, 0.5, 0.7};
  int32_t sink_tokens = 4;
  std::shared_ptr<const EvictorModel> learned;  // when policies hold learned
  // fp16's bytes per token at this model and block size (for the JSON and
  // the plot's ratio axis).
  double fp16_bytes_per_token = 0;
  std::function<void(int64_t, int64_t)> progress;
};

// Runs every combo over `streams` (each BOS first, all one length) and marks
// the Pareto front. InvalidArgument for no streams, no combos, or a first
// combo that is not fp32 dense; a runner's error is returned as is.
absl::StatusOr<FrontierReport> RunFrontier(const std::vector<std::vector<int32_t>>& streams,
                                           const FrontierRunnerFactory& make_runner,
                                           const FrontierOptions& options);

// Sets `pareto` on the points no other point dominates (fewer or equal
// bytes and lower or equal Δppl, one of them strictly).
void MarkParetoFront(std::vector<FrontierPoint>* points);

// {"points": [{"name", "kv_dtype", "low_rank", "cross_layer", "policy",
// "budget", "bytes_per_token", "ppl", "delta_ppl_pct", "pareto"}],
// "reference": {"kv_dtype": "fp32", "ppl"}, "fp16_bytes_per_token", ...};
// low_rank is the kept fraction of the kv width and cross_layer the first
// merged layer, null when off; budget is null when dense.
std::string FrontierJson(const FrontierReport& report);
// One row per point, front points marked, sorted by bytes per token.
std::string FrontierTable(const FrontierReport& report);
// The gnuplot script (data inline): Δppl % against bytes per token, every
// point labelled, the front drawn as a line, into png_path.
std::string FrontierGnuplot(const FrontierReport& report, const std::string& png_path);

}  // namespace kvserve
