#include "model/eval/eviction_study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/sizing/block_count.h"
#include "kernels/batch_input.h"
#include "model/eval/evicting_sequence.h"
#include "model/eval/kv_eval.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace kvserve {
namespace {

// -log p(target) from a row of logits, in double.
double Nll(const float* row, int vocab, int32_t target) {
  const double m = *std::max_element(row, row + vocab);
  double s = 0;
  for (int j = 0; j < vocab; ++j) s += std::exp(static_cast<double>(row[j]) - m);
  return m + std::log(s) - row[target];
}

// Sums of NLL per window of target positions, over one or more streams.
class WindowedNll {
 public:
  WindowedNll(int32_t length, int32_t window) : length_(length), window_(window) {
    const int32_t n = (length + window - 1) / window;
    sum_.assign(n, 0.0);
    count_.assign(n, 0);
  }
  void Add(int32_t position, double nll) {
    sum_[position / window_] += nll;
    ++count_[position / window_];
    total_ += nll;
    ++total_count_;
  }
  void Fill(StudyRun* run) const {
    run->ppl = total_count_ > 0 ? std::exp(total_ / total_count_) : 0;
    run->windows.clear();
    for (size_t k = 0; k < sum_.size(); ++k) {
      if (count_[k] == 0) continue;
      StudyWindow w;
      w.start = static_cast<int32_t>(k) * window_;
      w.end = std::min(length_, w.start + window_);
      w.ppl = std::exp(sum_[k] / count_[k]);
      run->windows.push_back(w);
    }
  }

 private:
  int32_t length_, window_;
  std::vector<double> sum_;
  std::vector<int64_t> count_;
  double total_ = 0;
  int64_t total_count_ = 0;
};

struct Progress {
  std::function<void(int64_t, int64_t)> fn;
  int64_t done = 0, total = 0;
  void Advance(int64_t n) {
    done += n;
    if (fn) fn(done, total);
  }
};

std::shared_ptr<const EvictionPolicy> PolicyFor(
    EvictionPolicyKind kind, const std::shared_ptr<const EvictorModel>& learned) {
  if (kind == EvictionPolicyKind::kNone) return nullptr;
  if (kind == EvictionPolicyKind::kLearned) return MakeLearnedPolicy(learned);
  return MakeEvictionPolicy(kind);
}

// Teacher-forces stream[0, n - 1) through `seq` (its own step sizes, at most
// `max_rows`) and adds every prediction's NLL. Returns the blocks it held at
// most.
absl::Status RunStream(EvictingSequence& seq, std::span<const int32_t> stream, int32_t max_rows,
                       int vocab, WindowedNll* acc, Progress* progress) {
  const int32_t n = static_cast<int32_t>(stream.size());
  std::vector<float> logits;
  for (int32_t t = 0; t + 1 < n;) {
    const int32_t rows = std::min({seq.StepRows(n - 1 - t), max_rows, n - 1 - t});
    KV_RETURN_IF_ERROR(seq.Step(stream, t, t + rows, &logits));
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t target = t + i + 1;
      acc->Add(target, Nll(logits.data() + static_cast<size_t>(i) * vocab, vocab, stream[target]));
    }
    t += rows;
    progress->Advance(rows);
  }
  return absl::OkStatus();
}

// The recompute baseline: target t predicted from stream[max(0, t - budget),
// t) computed from scratch at positions 0 ...
absl::Status Recompute(ModelRunner& runner, std::span<const int32_t> stream, int32_t budget,
                       int32_t batch_windows, int32_t dense_chunk, WindowedNll* acc,
                       Progress* progress) {
  const int32_t n = static_cast<int32_t>(stream.size());
  const int vocab = runner.config().vocab_size;
  // Targets 1 .. budget: one dense pass from the start.
  {
    EvictingSequence dense(runner, nullptr, EvictionParams{}, 0);
    const int32_t head = std::min(n, budget + 1);
    KV_RETURN_IF_ERROR(RunStream(dense, stream.first(head), dense_chunk, vocab, acc, progress));
  }
  const int32_t bs = runner.kv_format().block_size();
  const int32_t blocks_per = BlocksForTokens(budget, bs);
  if (int64_t{blocks_per} * batch_windows > runner.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("recompute needs ", int64_t{blocks_per} * batch_windows,
                     " blocks, the runner has ", runner.num_blocks()));
  }
  BatchInput batch;
  std::vector<float> logits;
  for (int32_t first = budget + 1; first < n; first += batch_windows) {
    const int32_t last = std::min(n, first + batch_windows);  // targets [first, last)
    const int32_t w = last - first;
    batch.Clear();
    batch.max_blocks_per_seq = blocks_per;
    for (int32_t k = 0; k < w; ++k) {
      const int32_t target = first + k;
      for (int32_t i = 0; i < budget; ++i) {
        batch.token_ids.push_back(stream[target - budget + i]);
        batch.positions.push_back(i);
        batch.slot_mapping.push_back(int64_t{k * blocks_per + i / bs} * bs + i % bs);
      }
      batch.query_start.push_back(batch.num_tokens());
      batch.context_len.push_back(budget);
      for (int32_t b = 0; b < blocks_per; ++b) batch.block_table.push_back(k * blocks_per + b);
      batch.logits_rows.push_back(batch.num_tokens() - 1);
    }
    logits.resize(static_cast<size_t>(w) * vocab);
    KV_RETURN_IF_ERROR(runner.Forward(batch, logits));
    for (int32_t k = 0; k < w; ++k) {
      acc->Add(first + k,
               Nll(logits.data() + static_cast<size_t>(k) * vocab, vocab, stream[first + k]));
    }
    progress->Advance(w);
  }
  return absl::OkStatus();
}

absl::StatusOr<FirstTokenAttention> MeasureFirstToken(ModelRunner& runner,
                                                      std::span<const int32_t> stream) {
  const ModelConfig& c = runner.config();
  const int32_t bs = runner.kv_format().block_size();
  const int32_t n = std::min<int32_t>(
      {static_cast<int32_t>(stream.size()), c.max_position_embeddings, runner.num_blocks() * bs});
  BatchInput b;
  b.Clear();
  for (int32_t i = 0; i < n; ++i) {
    b.token_ids.push_back(stream[i]);
    b.positions.push_back(i);
    b.slot_mapping.push_back(i);
  }
  b.query_start.push_back(n);
  b.context_len.push_back(n);
  b.max_blocks_per_seq = BlocksForTokens(n, bs);
  for (int32_t k = 0; k < b.max_blocks_per_seq; ++k) b.block_table.push_back(k);
  b.logits_rows.push_back(n - 1);
  b.attention_stats.push_back(1);
  std::vector<float> logits(c.vocab_size), stats(static_cast<size_t>(c.num_layers) * n);
  KV_RETURN_IF_ERROR(runner.Forward(b, logits));
  KV_RETURN_IF_ERROR(runner.ReadAttentionStats(stats));
  FirstTokenAttention f;
  f.rows = n;
  for (int32_t r = 0; r < n; ++r) f.uniform_share += 1.0 / (r + 1);
  f.uniform_share /= n;
  for (int l = 0; l < c.num_layers; ++l) {
    double total = 0;
    for (int32_t j = 0; j < n; ++j) total += stats[static_cast<size_t>(l) * n + j];
    f.share.push_back(stats[static_cast<size_t>(l) * n] / total);
  }
  return f;
}

std::string Label(EvictionPolicyKind kind, int32_t sinks) {
  if (kind == EvictionPolicyKind::kNone) return "none (dense)";
  if (kind == EvictionPolicyKind::kStreaming) return absl::StrCat("streaming (", sinks, " sinks)");
  return std::string(EvictionPolicyName(kind));
}

absl::Status CheckStream(std::span<const int32_t> stream, int vocab) {
  if (stream.size() < 2) {
    return absl::InvalidArgumentError("a study stream needs at least two tokens");
  }
  for (int32_t t : stream) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary (", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> BuildTokenStream(std::string_view text,
                                                      const Tokenizer& tokenizer, int32_t tokens) {
  const std::vector<std::string> stories = SplitStories(text);
  // Enough stories for the tokens (a few characters each), grown as needed.
  size_t take = 0;
  size_t chars = 0;
  std::vector<int32_t> ids;
  while (take < stories.size()) {
    const size_t want = static_cast<size_t>(tokens) * 6 + 64;
    while (take < stories.size() && chars < want) chars += stories[take++].size() + 1;
    std::string joined;
    for (size_t i = 0; i < take; ++i) {
      if (i > 0) joined.push_back('\n');
      joined += stories[i];
    }
    ids = tokenizer.Encode(joined, /*add_bos=*/true);
    if (static_cast<int32_t>(ids.size()) >= tokens) {
      ids.resize(tokens);
      return ids;
    }
    chars *= 2;
  }
  return absl::NotFoundError(
      absl::StrCat("the text has only ", ids.size(), " tokens; ", tokens, " were asked for"));
}

const StudyRun* EvictionStudyReport::Find(std::string_view label, std::string_view kv_dtype) const {
  for (const StudyRun& r : runs) {
    if (r.label == label && r.kv_dtype == kv_dtype) return &r;
  }
  return nullptr;
}

absl::StatusOr<EvictionStudyReport> RunLongTextStudy(std::span<const int32_t> stream,
                                                     const StudyRunnerFactory& make_runner,
                                                     const EvictionStudyOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.window < 1 || o.budget < 2 || o.dense_chunk < 1 || o.recompute_batch < 1 ||
      o.dtypes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the study needs a window >= 1, a budget >= 2, chunks >= 1 and a KV dtype; got window ",
        o.window, ", budget ", o.budget));
  }
  const int32_t n = static_cast<int32_t>(stream.size());
  // The runs, in order: recompute, then each policy (streaming twice).
  struct Plan {
    EvictionPolicyKind kind;
    int32_t sinks;
    bool recompute;
  };
  std::vector<Plan> plans;
  if (o.recompute) plans.push_back({EvictionPolicyKind::kNone, -1, true});
  for (EvictionPolicyKind k : o.policies) {
    if (k == EvictionPolicyKind::kLearned && o.learned == nullptr) {
      return absl::InvalidArgumentError("policy learned needs a trained evictor model");
    }
    plans.push_back({k, k == EvictionPolicyKind::kStreaming ? o.sink_tokens : -1, false});
    if (k == EvictionPolicyKind::kStreaming && o.sinkless && o.sink_tokens != 0) {
      plans.push_back({k, 0, false});
    }
  }
  Progress progress{o.progress, 0, static_cast<int64_t>(plans.size() * o.dtypes.size()) * (n - 1)};
  EvictionStudyReport report;
  report.kind = "long_text";
  for (const KvDtypeSpec& dtype : o.dtypes) {
    const int32_t probe_blocks = 1;
    KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> probe, make_runner(dtype, probe_blocks));
    const int32_t bs = probe->kv_format().block_size();
    const int32_t blocks = std::max(BlocksForTokens(n, bs) + 1,
                                    o.recompute_batch * (BlocksForTokens(o.budget, bs)) + 1);
    probe.reset();
    KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, make_runner(dtype, blocks));
    const ModelConfig& c = runner->config();
    KV_RETURN_IF_ERROR(CheckStream(stream, c.vocab_size));
    report.block_size = bs;
    report.max_position_embeddings = c.max_position_embeddings;
    if (report.first_token.rows == 0) {
      KV_ASSIGN_OR_RETURN(report.first_token, MeasureFirstToken(*runner, stream));
    }
    for (const Plan& p : plans) {
      StudyRun run;
      run.kv_dtype = dtype.ToString();
      run.stream_tokens = n;
      WindowedNll acc(n, o.window);
      if (p.recompute) {
        run.policy = run.label = "recompute";
        run.budget = o.budget;
        KV_RETURN_IF_ERROR(Recompute(*runner, stream, o.budget, o.recompute_batch, o.dense_chunk,
                                     &acc, &progress));
      } else {
        run.policy = std::string(EvictionPolicyName(p.kind));
        run.label = Label(p.kind, p.sinks);
        EvictionParams params;
        params.policy = p.kind;
        if (p.kind != EvictionPolicyKind::kNone) {
          params.budget = o.budget;
          params.sink_tokens = std::max(0, p.sinks);
          params.recent_tokens = p.kind == EvictionPolicyKind::kStreaming ? 0 : o.recent_tokens;
          KV_RETURN_IF_ERROR(params.Validate(kEvictionConfigFields));
          run.budget = o.budget;
          run.sink_tokens = p.sinks;
        }
        EvictingSequence seq(*runner, PolicyFor(p.kind, o.learned), params, o.budget);
        KV_RETURN_IF_ERROR(RunStream(seq, stream, o.dense_chunk, c.vocab_size, &acc, &progress));
        run.max_blocks_held = seq.max_blocks_held();
      }
      acc.Fill(&run);
      report.runs.push_back(std::move(run));
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

absl::StatusOr<EvictionStudyReport> RunBudgetSweep(const std::vector<std::vector<int32_t>>& streams,
                                                   const StudyRunnerFactory& make_runner,
                                                   const BudgetSweepOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (streams.empty() || o.fractions.empty() || o.window < 1) {
    return absl::InvalidArgumentError("the sweep needs streams, budget fractions and a window");
  }
  const int32_t n = static_cast<int32_t>(streams[0].size());
  for (const auto& s : streams) {
    if (static_cast<int32_t>(s.size()) != n) {
      return absl::InvalidArgumentError("the sweep's streams must have one length");
    }
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> probe, make_runner(o.dtype, 1));
  const int32_t bs = probe->kv_format().block_size();
  probe.reset();
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                      make_runner(o.dtype, BlocksForTokens(n, bs) + 2));
  const ModelConfig& c = runner->config();
  for (const auto& s : streams) KV_RETURN_IF_ERROR(CheckStream(s, c.vocab_size));
  struct Plan {
    EvictionPolicyKind kind;
    int32_t budget;
  };
  std::vector<Plan> plans = {{EvictionPolicyKind::kNone, 0}};
  for (EvictionPolicyKind k : o.policies) {
    if (k == EvictionPolicyKind::kNone) continue;
    if (k == EvictionPolicyKind::kLearned && o.learned == nullptr) {
      return absl::InvalidArgumentError("policy learned needs a trained evictor model");
    }
    for (double f : o.fractions) {
      plans.push_back({k, std::max(2, static_cast<int32_t>(std::lround(f * n)))});
    }
  }
  Progress progress{o.progress, 0, static_cast<int64_t>(plans.size() * streams.size()) * (n - 1)};
  EvictionStudyReport report;
  report.kind = "sweep";
  report.block_size = bs;
  report.max_position_embeddings = c.max_position_embeddings;
  for (const Plan& p : plans) {
    StudyRun run;
    run.policy = std::string(EvictionPolicyName(p.kind));
    run.kv_dtype = o.dtype.ToString();
    run.budget = p.budget;
    run.stream_tokens = n;
    run.num_streams = static_cast<int32_t>(streams.size());
    run.label = p.kind == EvictionPolicyKind::kNone ? "none (dense)"
                                                    : absl::StrCat(run.policy, " @ ", p.budget);
    EvictionParams params;
    params.policy = p.kind;
    if (p.kind != EvictionPolicyKind::kNone) {
      params.budget = p.budget;
      params.sink_tokens = std::min(o.sink_tokens, p.budget - 1);
      KV_RETURN_IF_ERROR(params.Validate(kEvictionConfigFields));
      if (p.kind == EvictionPolicyKind::kStreaming) run.sink_tokens = params.sink_tokens;
    }
    WindowedNll acc(n, o.window);
    for (const auto& s : streams) {
      EvictingSequence seq(*runner, PolicyFor(p.kind, o.learned), params, std::max(2, p.budget));
      KV_RETURN_IF_ERROR(RunStream(seq, s, n, c.vocab_size, &acc, &progress));
      run.max_blocks_held = std::max(run.max_blocks_held, seq.max_blocks_held());
    }
    acc.Fill(&run);
    report.runs.push_back(std::move(run));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string EvictionStudyJson(const EvictionStudyReport& r) {
  nlohmann::json j;
  j["model"] = r.model;
  j["text"] = r.text;
  j["kind"] = r.kind;
  j["block_size"] = r.block_size;
  j["max_position_embeddings"] = r.max_position_embeddings;
  j["seconds"] = r.seconds;
  nlohmann::json runs = nlohmann::json::array();
  for (const StudyRun& run : r.runs) {
    nlohmann::json windows = nlohmann::json::array();
    for (const StudyWindow& w : run.windows) {
      windows.push_back({{"start", w.start}, {"end", w.end}, {"ppl", w.ppl}});
    }
    nlohmann::json o = {{"policy", run.policy},
                        {"label", run.label},
                        {"kv_dtype", run.kv_dtype},
                        {"budget", run.budget},
                        {"stream_tokens", run.stream_tokens},
                        {"streams", run.num_streams},
                        {"ppl", run.ppl},
                        {"windows", std::move(windows)}};
    if (run.sink_tokens >= 0) o["sink_tokens"] = run.sink_tokens;
    if (run.max_blocks_held > 0) o["max_blocks_held"] = run.max_blocks_held;
    runs.push_back(std::move(o));
  }
  j["runs"] = std::move(runs);
  if (r.first_token.rows > 0) {
    j["first_token_attention"] = {{"rows", r.first_token.rows},
                                  {"uniform_share", r.first_token.uniform_share},
                                  {"share_per_layer", r.first_token.share}};
  }
  return j.dump(2) + "\n";
}

std::string EvictionStudyTable(const EvictionStudyReport& r) {
  std::string out;
  if (r.kind == "sweep") {
    const StudyRun* dense = nullptr;
    for (const StudyRun& run : r.runs) {
      if (run.policy == "none") dense = &run;
    }
    absl::StrAppendFormat(&out, "%-16s %7s %8s %10s %9s\n", "policy", "budget", "of ctx", "ppl",
                          "vs none");
    for (const StudyRun& run : r.runs) {
      const double rel = dense != nullptr ? (run.ppl / dense->ppl - 1.0) * 100.0 : 0.0;
      absl::StrAppendFormat(&out, "%-16s %7d %7.0f%% %10.4f %+8.2f%%\n", run.policy, run.budget,
                            run.budget > 0 ? 100.0 * run.budget / run.stream_tokens : 100.0,
                            run.ppl, rel);
    }
    return out;
  }
  absl::StrAppendFormat(&out, "%-20s %-8s %9s %11s %11s %11s %12s\n", "run", "kv_dtype", "ppl",
                        "ppl 0-256", "ppl 512-768", "ppl last", "worst/recmp");
  for (const StudyRun& run : r.runs) {
    auto window_ppl = [&](int32_t start) -> double {
      for (const StudyWindow& w : run.windows) {
        if (w.start == start) return w.ppl;
      }
      return 0;
    };
    double worst = 0;
    const StudyRun* rc = r.Find("recompute", run.kv_dtype);
    if (rc != nullptr && rc->windows.size() == run.windows.size()) {
      for (size_t k = 0; k < run.windows.size(); ++k) {
        worst = std::max(worst, run.windows[k].ppl / rc->windows[k].ppl);
      }
    }
    absl::StrAppendFormat(&out, "%-20s %-8s %9.3f %11.3f %11.3f %11.3f %11.3fx\n", run.label,
                          run.kv_dtype, run.ppl, window_ppl(0), window_ppl(512),
                          run.windows.empty() ? 0.0 : run.windows.back().ppl, worst);
  }
  if (r.first_token.rows > 0) {
    absl::StrAppendFormat(&out, "\nattention on the first token (dense, first %d rows), per layer:",
                          r.first_token.rows);
    for (double s : r.first_token.share) absl::StrAppendFormat(&out, " %.1f%%", 100 * s);
    absl::StrAppendFormat(&out, " (uniform attention: %.1f%%)\n",
                          100 * r.first_token.uniform_share);
  }
  return out;
}

std::string EvictionStudyGnuplot(const EvictionStudyReport& r, const std::string& kv_dtype,
                                 const std::string& png_path) {
  std::string out =
      absl::StrCat("set terminal pngcairo size 1100,650 font 'sans,11'\nset output '", png_path,
                   "'\nset termoption noenhanced\nset key outside right\nset grid\n");
  // Titles go in double quotes (labels have apostrophes).
  std::vector<const StudyRun*> runs;
  if (r.kind == "sweep") {
    absl::StrAppend(&out, "set title \"Perplexity against KV budget (",
                    r.runs.empty() ? 0 : r.runs[0].num_streams, " streams of ",
                    r.runs.empty() ? 0 : r.runs[0].stream_tokens, " tokens)\"\n",
                    "set xlabel 'KV budget (fraction of the context)'\nset ylabel 'perplexity'\n",
                    "set xrange [0:0.8]\n");
    std::vector<std::string> policies;
    double dense = 0;
    for (const StudyRun& run : r.runs) {
      if (run.policy == "none") dense = run.ppl;
      if (run.policy != "none" &&
          std::find(policies.begin(), policies.end(), run.policy) == policies.end()) {
        policies.push_back(run.policy);
      }
    }
    std::string plot = "plot ";
    std::string data;
    for (size_t i = 0; i < policies.size(); ++i) {
      absl::StrAppend(&plot, i ? ", " : "", "$d", i, " with linespoints lw 2 title \"", policies[i],
                      "\"");
      absl::StrAppend(&data, "$d", i, " << EOD\n");
      for (const StudyRun& run : r.runs) {
        if (run.policy == policies[i]) {
          absl::StrAppendFormat(&data, "%.4f %.6f\n",
                                static_cast<double>(run.budget) / run.stream_tokens, run.ppl);
        }
      }
      absl::StrAppend(&data, "EOD\n");
    }
    absl::StrAppendFormat(
        &plot, ", %.6f with lines dt 2 lw 2 lc rgb 'black' title \"none (dense)\"\n", dense);
    return out + data + plot;
  }
  absl::StrAppend(&out, "set title \"Perplexity per window over one stream of ",
                  r.runs.empty() ? 0 : r.runs[0].stream_tokens, " tokens (KV ", kv_dtype,
                  "; dotted: the model's ", r.max_position_embeddings, " positions)\"\n",
                  "set xlabel 'position in the stream'\nset ylabel 'perplexity (log scale)'\n",
                  "set logscale y\n");
  absl::StrAppendFormat(&out, "set arrow from %d, graph 0 to %d, graph 1 nohead dt 3\n",
                        r.max_position_embeddings, r.max_position_embeddings);
  for (const StudyRun& run : r.runs) {
    if (run.kv_dtype == kv_dtype) runs.push_back(&run);
  }
  std::string data, plot = "plot ";
  for (size_t i = 0; i < runs.size(); ++i) {
    absl::StrAppend(&data, "$d", i, " << EOD\n");
    for (const StudyWindow& w : runs[i]->windows) {
      absl::StrAppendFormat(&data, "%.1f %.6f\n", 0.5 * (w.start + w.end), w.ppl);
    }
    absl::StrAppend(&data, "EOD\n");
    absl::StrAppend(&plot, i ? ", " : "", "$d", i, " with linespoints lw 2 title \"",
                    runs[i]->label, "\"");
  }
  return out + data + plot + "\n";
}

}  // namespace kvserve
