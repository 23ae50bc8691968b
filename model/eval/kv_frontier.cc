#include "model/eval/kv_frontier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/eval/eviction_study.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace kvserve {
namespace {

bool IsReference(const FrontierCombo& c) {
  return c.kv_dtype.ToString() == "fp32" && c.low_rank == 0 && c.cross_layer < 0;
}

std::string PointName(const FrontierCombo& c, const StudyRun& run) {
  if (run.policy == "none") return c.name;
  return absl::StrFormat("%s @ %s %.0f%%", c.name, run.policy,
                         100.0 * run.budget / run.stream_tokens);
}

}  // namespace

void MarkParetoFront(std::vector<FrontierPoint>* points) {
  for (FrontierPoint& p : *points) {
    p.pareto = std::none_of(points->begin(), points->end(), [&](const FrontierPoint& q) {
      return q.bytes_per_token <= p.bytes_per_token && q.delta_ppl_percent <= p.delta_ppl_percent &&
             (q.bytes_per_token < p.bytes_per_token || q.delta_ppl_percent < p.delta_ppl_percent);
    });
  }
}

absl::StatusOr<FrontierReport> RunFrontier(const std::vector<std::vector<int32_t>>& streams,
                                           const FrontierRunnerFactory& make_runner,
                                           const FrontierOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (streams.empty() || streams[0].size() < 2) {
    return absl::InvalidArgumentError("the frontier needs token streams of at least 2 tokens");
  }
  if (o.combos.empty() || !IsReference(o.combos[0])) {
    return absl::InvalidArgumentError("the frontier's first combination must be fp32 (dense)");
  }
  const int32_t n = static_cast<int32_t>(streams[0].size());
  int64_t runs_total = 0;
  for (const FrontierCombo& c : o.combos) {
    runs_total += 1 + (c.evict ? static_cast<int64_t>(o.policies.size() * o.fractions.size()) : 0);
  }
  const int64_t per_run = static_cast<int64_t>(streams.size()) * (n - 1);
  int64_t done_before = 0;

  FrontierReport report;
  report.num_streams = static_cast<int32_t>(streams.size());
  report.stream_tokens = n;
  report.fp16_bytes_per_token = o.fp16_bytes_per_token;
  for (const FrontierCombo& combo : o.combos) {
    // What one token costs in this combo's pool, as allocated.
    KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> probe, make_runner(combo, 1));
    const int32_t bs = probe->kv_format().block_size();
    const double bytes = static_cast<double>(probe->memory_info().kv_bytes_per_block) / bs;
    probe.reset();
    report.block_size = bs;

    StudyRunnerFactory factory = [&](const KvDtypeSpec&, int32_t num_blocks) {
      return make_runner(combo, num_blocks);
    };
    BudgetSweepOptions so;
    if (combo.evict) so.policies = o.policies;
    so.fractions = o.fractions;
    so.dtype = combo.kv_dtype;
    so.window = n;
    so.sink_tokens = o.sink_tokens;
    so.learned = o.learned;
    if (o.progress) {
      so.progress = [&](int64_t done, int64_t) {
        o.progress(done_before + done, runs_total * per_run);
      };
    }
    KV_ASSIGN_OR_RETURN(EvictionStudyReport sweep, RunBudgetSweep(streams, factory, so));
    done_before += static_cast<int64_t>(sweep.runs.size()) * per_run;
    for (const StudyRun& run : sweep.runs) {
      FrontierPoint p;
      p.name = PointName(combo, run);
      p.combo = combo;
      p.policy = run.policy;
      p.budget = run.policy == "none" ? 0 : run.budget;
      p.bytes_per_token = p.budget > 0 ? bytes * p.budget / run.stream_tokens : bytes;
      p.ppl = run.ppl;
      report.points.push_back(std::move(p));
    }
  }
  report.reference_ppl = report.points[0].ppl;
  for (FrontierPoint& p : report.points) {
    p.delta_ppl_percent = (p.ppl / report.reference_ppl - 1.0) * 100.0;
  }
  MarkParetoFront(&report.points);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string FrontierJson(const FrontierReport& r) {
  nlohmann::json points = nlohmann::json::array();
  for (const FrontierPoint& p : r.points) {
    nlohmann::json j = {{"name", p.name},
                        {"kv_dtype", p.combo.kv_dtype.ToString()},
                        {"low_rank", nullptr},
                        {"cross_layer", nullptr},
                        {"policy", p.policy},
                        {"budget", nullptr},
                        {"bytes_per_token", p.bytes_per_token},
                        {"ppl", p.ppl},
                        {"delta_ppl_pct", p.delta_ppl_percent},
                        {"pareto", p.pareto}};
    if (p.combo.low_rank > 0) j["low_rank"] = p.combo.low_rank;
    if (p.combo.cross_layer >= 0) j["cross_layer"] = p.combo.cross_layer;
    if (p.budget > 0) j["budget"] = p.budget;
    points.push_back(std::move(j));
  }
  nlohmann::json j = {{"model", r.model},
                      {"text", r.text},
                      {"calibration_text", r.calibration_text},
                      {"streams", r.num_streams},
                      {"stream_tokens", r.stream_tokens},
                      {"block_size", r.block_size},
                      {"seconds", r.seconds},
                      {"reference", {{"kv_dtype", "fp32"}, {"ppl", r.reference_ppl}}},
                      {"fp16_bytes_per_token", r.fp16_bytes_per_token},
                      {"points", std::move(points)}};
  return j.dump(2) + "\n";
}

std::string FrontierTable(const FrontierReport& r) {
  std::vector<const FrontierPoint*> sorted;
  for (const FrontierPoint& p : r.points) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const FrontierPoint* a, const FrontierPoint* b) {
                     return a->bytes_per_token > b->bytes_per_token;
                   });
  std::string out = absl::StrFormat("%-34s %11s %8s %9s %9s  %s\n", "setting", "bytes/token",
                                    "vs fp16", "ppl", "Δppl%", "front");
  for (const FrontierPoint* p : sorted) {
    const double ratio =
        r.fp16_bytes_per_token > 0 ? p->bytes_per_token / r.fp16_bytes_per_token : 0.0;
    absl::StrAppendFormat(&out, "%-34s %11.1f %7.3fx %9.4f %+8.3f%%  %s\n", p->name,
                          p->bytes_per_token, ratio, p->ppl, p->delta_ppl_percent,
                          p->pareto ? "*" : "");
  }
  return out;
}

std::string FrontierGnuplot(const FrontierReport& r, const std::string& png_path) {
  // Δppl beyond kClip % would squash the rest: such points are named (the
  // dense ones) or counted (evicted ones) in the title instead.
  constexpr double kClip = 12.0;
  double lo = 0, hi = 0, xlo = 0, xhi = 0;
  std::string off;
  int off_evicted = 0;
  std::vector<std::string> series = {"none"};
  for (const FrontierPoint& p : r.points) {
    if (p.delta_ppl_percent > kClip) {
      if (p.policy != "none") {
        ++off_evicted;
      } else {
        absl::StrAppendFormat(&off, "%s%s %+.1f%%", off.empty() ? "" : ", ", p.name,
                              p.delta_ppl_percent);
      }
      continue;
    }
    lo = std::min(lo, p.delta_ppl_percent);
    hi = std::max(hi, p.delta_ppl_percent);
    xlo = xlo == 0 ? p.bytes_per_token : std::min(xlo, p.bytes_per_token);
    xhi = std::max(xhi, p.bytes_per_token);
    if (std::find(series.begin(), series.end(), p.policy) == series.end()) {
      series.push_back(p.policy);
    }
  }
  if (off_evicted > 0) {
    absl::StrAppend(&off, off.empty() ? "" : ", ", off_evicted, " evicted point",
                    off_evicted > 1 ? "s" : "");
  }
  const double pad = std::max(0.1, 0.08 * (hi - lo));
  std::string out = absl::StrCat(
      "set terminal pngcairo size 1200,750 font 'sans,10'\nset output '", png_path,
      "'\nset termoption noenhanced\nset grid\nset key top right\n",
      "set title \"KV compression frontier: ", r.num_streams, " held-out streams of ",
      r.stream_tokens, " tokens; fp32 dense ppl ", absl::StrFormat("%.4f", r.reference_ppl),
      off.empty() ? "" : absl::StrCat("\\noff the chart: ", off), "\"\n",
      "set xlabel 'KV bytes per token (log scale)'\nset logscale x\n",
      absl::StrFormat("set xrange [%.3f:%.3f]\nset yrange [%.4f:%.4f]\n", xlo * 0.85, xhi * 1.2,
                      lo - pad, hi + pad),
      "set ylabel 'perplexity change against the fp32 dense cache (%)'\n");
  std::string tics;
  for (double t : {25, 50, 75, 100, 150, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000, 4000}) {
    if (t >= xlo * 0.85 && t <= xhi * 1.2) absl::StrAppend(&tics, tics.empty() ? "" : ", ", t);
  }
  if (!tics.empty()) absl::StrAppend(&out, "set xtics (", tics, ")\n");
  std::string data, plot = "plot $front with steps lw 2 lc rgb 'black' title 'Pareto front'";
  for (size_t k = 0; k < series.size(); ++k) {
    absl::StrAppend(&data, "$s", k, " << EOD\n");
    for (const FrontierPoint& p : r.points) {
      if (p.policy != series[k] || p.delta_ppl_percent > kClip) continue;
      absl::StrAppendFormat(&data, "%.3f %.5f\n", p.bytes_per_token, p.delta_ppl_percent);
    }
    absl::StrAppend(&data, "EOD\n");
    absl::StrAppend(&plot, ", $s", k, " with points pt 7 ps 1.3 title \"",
                    series[k] == "none" ? "dense" : absl::StrCat("evicted: ", series[k]), "\"");
  }
  // Labels on the dense points and on the front.
  std::vector<const FrontierPoint*> front;
  absl::StrAppend(&data, "$labels << EOD\n");
  for (const FrontierPoint& p : r.points) {
    if (p.delta_ppl_percent > kClip) continue;
    if (p.pareto) front.push_back(&p);
    if (p.pareto || p.policy == "none") {
      absl::StrAppendFormat(&data, "%.3f %.5f \"%s\"\n", p.bytes_per_token, p.delta_ppl_percent,
                            p.name);
    }
  }
  absl::StrAppend(&data, "EOD\n");
  std::sort(front.begin(), front.end(), [](const FrontierPoint* a, const FrontierPoint* b) {
    return a->bytes_per_token < b->bytes_per_token;
  });
  absl::StrAppend(&data, "$front << EOD\n");
  for (const FrontierPoint* p : front) {
    absl::StrAppendFormat(&data, "%.3f %.5f\n", p->bytes_per_token, p->delta_ppl_percent);
  }
  absl::StrAppend(&data, "EOD\n");
  return out + data + plot +
         ", $labels using 1:2:3 with labels offset 0.5,0.7 left rotate by 20 font 'sans,8' "
         "notitle\n";
}

}  // namespace kvserve
