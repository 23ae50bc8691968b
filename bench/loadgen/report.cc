#include "bench/loadgen/report.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve::bench {
namespace {

using json = nlohmann::ordered_json;

json Opt(const std::optional<double>& v) { return v.has_value() ? json(*v) : json(nullptr); }

json SummaryJson(const Summary& s) {
  if (s.count == 0) {
    return {{"count", 0},     {"mean", nullptr}, {"min", nullptr}, {"p50", nullptr},
            {"p90", nullptr}, {"p99", nullptr},  {"max", nullptr}};
  }
  return {{"count", s.count}, {"mean", s.mean}, {"min", s.min}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

json ServerJson(const ServerRunStats& s) {
  return {{"scraped", s.scraped},
          {"kv_usage_before", Opt(s.kv_usage_before)},
          {"kv_usage_after", Opt(s.kv_usage_after)},
          {"kv_usage_peak", Opt(s.kv_usage_peak)},
          {"running_peak", Opt(s.running_peak)},
          {"kv_blocks", Opt(s.kv_blocks)},
          {"prefix_query_tokens", Opt(s.prefix_query_tokens)},
          {"prefix_hit_tokens", Opt(s.prefix_hit_tokens)},
          {"prefix_hit_rate", Opt(s.prefix_hit_rate)},
          {"preemptions", Opt(s.preemptions)},
          {"swap_out_blocks", Opt(s.swap_out_blocks)},
          {"prompt_tokens", Opt(s.prompt_tokens)},
          {"generation_tokens", Opt(s.generation_tokens)},
          {"cpu_seconds", Opt(s.cpu_seconds)}};
}

json LoadJson(const LoadSpec& l) {
  const bool closed = l.mode == LoadSpec::Mode::kClosed;
  return {{"mode", closed ? "closed" : "open"},
          {"concurrency", closed ? json(l.concurrency) : json(nullptr)},
          {"request_rate", closed ? json(nullptr) : json(l.request_rate)},
          {"max_concurrency", closed ? json(nullptr) : json(l.max_concurrency)},
          {"num_requests", l.num_requests},
          {"duration_limit_s", l.duration_s > 0 ? json(l.duration_s) : json(nullptr)}};
}

std::string LoadName(const LoadSpec& l) {
  if (l.mode == LoadSpec::Mode::kClosed) return absl::StrCat("closed c=", l.concurrency);
  if (l.request_rate <= 0) return "open burst";
  return absl::StrFormat("open %.3g/s", l.request_rate);
}

// Three significant digits for small values, whole numbers for large ones.
std::string Ms(double v) {
  if (v < 1) return absl::StrFormat("%.3f", v);
  if (v < 10) return absl::StrFormat("%.2f", v);
  if (v < 100) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.0f", v);
}

std::string Triple(const Summary& s) {
  if (s.count == 0) return "-";
  return absl::StrCat(Ms(s.p50), "/", Ms(s.p90), "/", Ms(s.p99));
}

std::string Pct(const std::optional<double>& v) {
  return v.has_value() ? absl::StrFormat("%.0f%%", *v * 100) : "-";
}

std::string Num(const std::optional<double>& v) {
  return v.has_value() ? absl::StrFormat("%.0f", *v) : "-";
}

}  // namespace

RunReport Aggregate(const LoadSpec& load, const LoadResult& result, const ServerRunStats& server) {
  RunReport r;
  r.load = load;
  r.duration_s = result.duration_s;
  r.server = server;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestResult& q : result.results) {
    if (!q.ok) {
      ++r.failed;
      if (r.errors.size() < 5 &&
          std::find(r.errors.begin(), r.errors.end(), q.error) == r.errors.end()) {
        r.errors.push_back(q.error);
      }
      continue;
    }
    ++r.completed;
    r.input_tokens += q.prompt_tokens >= 0 ? q.prompt_tokens : q.expected_input_tokens;
    r.output_tokens += q.output_tokens;
    if (q.cached_tokens >= 0) r.cached_tokens = r.cached_tokens.value_or(0) + q.cached_tokens;
    if (q.ttft_s >= 0) ttft.push_back(q.ttft_s * 1e3);
    if (q.output_tokens > 1 && q.ttft_s >= 0) {
      tpot.push_back((q.e2e_s - q.ttft_s) * 1e3 / static_cast<double>(q.output_tokens - 1));
    }
    for (double g : q.itl_s) itl.push_back(g * 1e3);
    e2e.push_back(q.e2e_s * 1e3);
  }
  if (r.duration_s > 0) {
    r.requests_per_s = static_cast<double>(r.completed) / r.duration_s;
    r.input_tokens_per_s = static_cast<double>(r.input_tokens) / r.duration_s;
    r.output_tokens_per_s = static_cast<double>(r.output_tokens) / r.duration_s;
    r.total_tokens_per_s = r.input_tokens_per_s + r.output_tokens_per_s;
  }
  if (r.completed > 0) {
    r.mean_output_tokens = static_cast<double>(r.output_tokens) / static_cast<double>(r.completed);
  }
  r.ttft_ms = Summarize(std::move(ttft));
  r.tpot_ms = Summarize(std::move(tpot));
  r.itl_ms = Summarize(std::move(itl));
  r.e2e_ms = Summarize(std::move(e2e));
  return r;
}

json ToJson(const BenchReport& report) {
  const ClientOptions& c = report.client;
  const WorkloadSpec& w = report.workload;
  json j;
  j["schema"] = kSchemaId;
  j["label"] = report.label;
  j["started_at"] = report.started_at;
  j["target"] = {
      {"api", ApiName(c.api)},
      {"url", c.url},
      {"grpc_target", c.grpc_target},
      {"model", c.model},
      {"max_model_len", report.max_model_len > 0 ? json(report.max_model_len) : json(nullptr)},
      {"stream", c.stream}};
  j["workload"] = {{"kind", WorkloadKindName(w.kind)},
                   {"num_prompts", w.num_requests},
                   {"input_len", w.input_len},
                   {"output_len", w.output_len},
                   {"input_sigma", w.input_sigma},
                   {"output_sigma", w.output_sigma},
                   {"min_len", w.min_len},
                   {"groups", w.groups},
                   {"prefix_len", w.prefix_len},
                   {"suffix_len", w.suffix_len},
                   {"seed", w.seed},
                   {"dataset", report.dataset},
                   {"tokenizer", report.tokenizer.empty() ? json(nullptr) : json(report.tokenizer)},
                   {"chars_per_token",
                    report.chars_per_token > 0 ? json(report.chars_per_token) : json(nullptr)},
                   {"token_ids", c.send_token_ids},
                   {"ignore_eos", c.ignore_eos},
                   {"temperature", c.temperature}};
  json runs = json::array();
  for (const RunReport& r : report.runs) {
    runs.push_back(
        {{"load", LoadJson(r.load)},
         {"duration_s", r.duration_s},
         {"requests", {{"completed", r.completed}, {"failed", r.failed}, {"errors", r.errors}}},
         {"tokens",
          {{"input", r.input_tokens},
           {"output", r.output_tokens},
           {"cached_prompt", r.cached_tokens.has_value() ? json(*r.cached_tokens) : json(nullptr)},
           {"mean_output_per_request", r.mean_output_tokens}}},
         {"throughput",
          {{"requests_per_s", r.requests_per_s},
           {"input_tokens_per_s", r.input_tokens_per_s},
           {"output_tokens_per_s", r.output_tokens_per_s},
           {"total_tokens_per_s", r.total_tokens_per_s}}},
         {"latency_ms",
          {{"ttft", SummaryJson(r.ttft_ms)},
           {"tpot", SummaryJson(r.tpot_ms)},
           {"itl", SummaryJson(r.itl_ms)},
           {"e2e", SummaryJson(r.e2e_ms)}}},
         {"server", ServerJson(r.server)}});
  }
  j["runs"] = std::move(runs);
  if (!report.probe_ran) {
    j["connection_probe"] = nullptr;
  } else {
    json cases = json::array();
    for (const ProbeCase& p : report.probe) {
      cases.push_back({{"name", p.name},
                       {"fresh_ms", SummaryJson(p.fresh_ms)},
                       {"kept_alive_ms", SummaryJson(p.kept_alive_ms)},
                       {"ratio_p50", p.ratio_p50},
                       {"failed", p.failed},
                       {"first_error", p.first_error}});
    }
    j["connection_probe"] = {{"requests_each", report.probe_requests}, {"cases", cases}};
  }
  return j;
}

nlohmann::ordered_json RequestRecords(int run, const LoadResult& result,
                                      const std::vector<BenchRequest>& workload) {
  std::vector<const RequestResult*> sorted;
  for (const RequestResult& r : result.results) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](const RequestResult* a, const RequestResult* b) {
    return a->request_index < b->request_index;
  });
  auto or_null = [](int64_t v) { return v >= 0 ? json(v) : json(nullptr); };
  json out = json::array();
  for (const RequestResult* r : sorted) {
    const BenchRequest* w = r->request_index >= 0 && !workload.empty()
                                ? &workload[static_cast<size_t>(r->request_index) % workload.size()]
                                : nullptr;
    out.push_back({{"run", run},
                   {"index", r->request_index},
                   {"group", w != nullptr && w->group >= 0 ? json(w->group) : json(nullptr)},
                   {"turn", w != nullptr && w->turn >= 0 ? json(w->turn) : json(nullptr)},
                   {"ok", r->ok},
                   {"error", r->ok ? json(nullptr) : json(r->error)},
                   {"ttft_ms", r->ttft_s >= 0 ? json(r->ttft_s * 1e3) : json(nullptr)},
                   {"e2e_ms", r->e2e_s * 1e3},
                   {"prompt_tokens", or_null(r->prompt_tokens)},
                   {"cached_tokens", or_null(r->cached_tokens)},
                   {"output_tokens", r->output_tokens},
                   {"text", r->text}});
  }
  return out;
}

std::string FormatTable(const BenchReport& report) {
  const WorkloadSpec& w = report.workload;
  std::string out = absl::StrFormat(
      "kvserve-bench  %s  api=%s model=%s  workload=%s", report.label.empty() ? "-" : report.label,
      ApiName(report.client.api), report.client.model, WorkloadKindName(w.kind));
  switch (w.kind) {
    case WorkloadKind::kFixed:
      absl::StrAppendFormat(&out, " (in %d, out %d)", w.input_len, w.output_len);
      break;
    case WorkloadKind::kShareGpt:
      absl::StrAppendFormat(&out, " (in median %d sigma %.2g, out median %d sigma %.2g)",
                            w.input_len, w.input_sigma, w.output_len, w.output_sigma);
      break;
    case WorkloadKind::kSharedPrefix:
      absl::StrAppendFormat(&out, " (%d groups, prefix %d + suffix %d, out %d)", w.groups,
                            w.prefix_len, w.suffix_len, w.output_len);
      break;
    case WorkloadKind::kLongDocument:
      absl::StrAppendFormat(&out, " (%d documents of %d, questions of %d, out %d)", w.groups,
                            w.prefix_len, w.suffix_len, w.output_len);
      break;
    case WorkloadKind::kMultiTurn:
      absl::StrAppendFormat(&out, " (%d conversations, first turn %d, +%d a turn, out %d)",
                            w.groups, w.prefix_len, w.suffix_len, w.output_len);
      break;
    case WorkloadKind::kLongContext:
      absl::StrAppendFormat(&out, " (max_model_len %d, out %d)", report.max_model_len,
                            w.output_len);
      break;
  }
  out += "\n";
  if (!report.runs.empty()) {
    absl::StrAppendFormat(&out, "%-13s %5s %7s %9s %-20s %-20s %-20s %-20s %6s %6s %6s %7s\n",
                          "load", "done", "req/s", "out tok/s", "TTFT ms p50/90/99",
                          "TPOT ms p50/90/99", "ITL ms p50/90/99", "E2E ms p50/90/99", "KVpeak",
                          "runmax", "prefix", "preempt");
    for (const RunReport& r : report.runs) {
      std::string done = absl::StrCat(r.completed);
      if (r.failed > 0) absl::StrAppend(&done, "!", r.failed);
      absl::StrAppendFormat(
          &out, "%-13s %5s %7.2f %9.1f %-20s %-20s %-20s %-20s %6s %6s %6s %7s\n", LoadName(r.load),
          done, r.requests_per_s, r.output_tokens_per_s, Triple(r.ttft_ms), Triple(r.tpot_ms),
          Triple(r.itl_ms), Triple(r.e2e_ms), Pct(r.server.kv_usage_peak),
          Num(r.server.running_peak), Pct(r.server.prefix_hit_rate), Num(r.server.preemptions));
      for (const std::string& e : r.errors) absl::StrAppend(&out, "  error: ", e, "\n");
    }
  }
  if (report.probe_ran) {
    absl::StrAppendFormat(&out, "%-13s %17s %17s %10s %6s\n", "connection", "fresh ms p50/p90",
                          "kept ms p50/p90", "kept/fresh", "failed");
    for (const ProbeCase& p : report.probe) {
      absl::StrAppendFormat(&out, "%-13s %17s %17s %9.2fx %6d\n", p.name,
                            absl::StrCat(Ms(p.fresh_ms.p50), "/", Ms(p.fresh_ms.p90)),
                            absl::StrCat(Ms(p.kept_alive_ms.p50), "/", Ms(p.kept_alive_ms.p90)),
                            p.ratio_p50, static_cast<int>(p.failed));
      if (!p.first_error.empty()) absl::StrAppend(&out, "  error: ", p.first_error, "\n");
    }
  }
  return out;
}

std::string UtcNowIso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace kvserve::bench
