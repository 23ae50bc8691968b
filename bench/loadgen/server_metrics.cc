#include "bench/loadgen/server_metrics.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace kvserve::bench {
namespace {

enum class Kind { kCounter, kGauge };

// The first listed metric the server exposes: counters summed, gauges maxed
// over its label sets. `label` (e.g. kind="active") must appear in the
// labels when given.
std::optional<double> Find(const std::vector<PromSample>& samples, Kind kind,
                           std::initializer_list<std::pair<const char*, const char*>> names) {
  for (const auto& [name, label] : names) {
    std::optional<double> v;
    for (const PromSample& s : samples) {
      if (s.name != name) continue;
      if (*label != '\0' && s.labels.find(label) == std::string::npos) continue;
      if (!v.has_value()) {
        v = s.value;
      } else {
        v = kind == Kind::kCounter ? *v + s.value : std::max(*v, s.value);
      }
    }
    if (v.has_value()) return v;
  }
  return std::nullopt;
}

std::optional<double> Max(std::optional<double> a, std::optional<double> b) {
  if (!a.has_value()) return b;
  if (!b.has_value()) return a;
  return std::max(*a, *b);
}

std::optional<double> Growth(std::optional<double> before, std::optional<double> after) {
  if (!before.has_value() || !after.has_value()) return std::nullopt;
  return *after - *before;
}

}  // namespace

std::vector<PromSample> ParsePrometheusText(std::string_view text) {
  std::vector<PromSample> out;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && !absl::ascii_isspace(line[i])) ++i;
    s.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      const size_t open = i;
      bool quoted = false;
      for (++i; i < line.size(); ++i) {
        if (quoted && line[i] == '\\') {
          ++i;
        } else if (line[i] == '"') {
          quoted = !quoted;
        } else if (!quoted && line[i] == '}') {
          break;
        }
      }
      if (i >= line.size()) continue;
      s.labels = std::string(line.substr(open + 1, i - open - 1));
      ++i;
    }
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(i));
    absl::string_view value = rest.substr(0, rest.find(' '));
    if (s.name.empty() || !absl::SimpleAtod(value, &s.value)) continue;
    out.push_back(std::move(s));
  }
  return out;
}

MetricsSnapshot ExtractSnapshot(const std::vector<PromSample>& samples) {
  MetricsSnapshot m;
  m.kv_usage = Find(samples, Kind::kGauge,
                    {{"kvserve_kv_usage_ratio", "kind=\"active\""},
                     {"vllm:kv_cache_usage_perc", ""},
                     {"vllm:gpu_cache_usage_perc", ""},
                     {"llamacpp:kv_cache_usage_ratio", ""},
                     {"sglang:token_usage", ""}});
  m.running = Find(samples, Kind::kGauge,
                   {{"kvserve_running_sequences", ""},
                    {"vllm:num_requests_running", ""},
                    {"llamacpp:requests_processing", ""},
                    {"sglang:num_running_reqs", ""}});
  m.prefix_queries = Find(samples, Kind::kCounter,
                          {{"kvserve_prefix_cache_queries_tokens_total", ""},
                           {"vllm:prefix_cache_queries_total", ""},
                           {"vllm:gpu_prefix_cache_queries_total", ""}});
  m.prefix_hits = Find(samples, Kind::kCounter,
                       {{"kvserve_prefix_cache_hits_tokens_total", ""},
                        {"vllm:prefix_cache_hits_total", ""},
                        {"vllm:gpu_prefix_cache_hits_total", ""}});
  m.preemptions = Find(samples, Kind::kCounter,
                       {{"kvserve_preemptions_total", ""}, {"vllm:num_preemptions_total", ""}});
  m.swap_out = Find(samples, Kind::kCounter, {{"kvserve_swap_out_blocks_total", ""}});
  m.kv_blocks = Find(samples, Kind::kGauge, {{"kvserve_kv_blocks_capacity", ""}});
  m.prompt_tokens = Find(samples, Kind::kCounter,
                         {{"kvserve_prompt_tokens_total", ""},
                          {"vllm:prompt_tokens_total", ""},
                          {"llamacpp:prompt_tokens_total", ""},
                          {"sglang:prompt_tokens_total", ""}});
  m.gen_tokens = Find(samples, Kind::kCounter,
                      {{"kvserve_generation_tokens_total", ""},
                       {"vllm:generation_tokens_total", ""},
                       {"llamacpp:tokens_predicted_total", ""},
                       {"sglang:generation_tokens_total", ""}});
  m.cpu_seconds = Find(samples, Kind::kCounter, {{"process_cpu_seconds_total", ""}});
  return m;
}

bool SplitHttpUrl(std::string_view url, std::string* host, int* port, std::string* path) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) return false;
  url.remove_prefix(kScheme.size());
  const size_t slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  *path = slash == std::string_view::npos ? "" : std::string(url.substr(slash));
  while (!path->empty() && path->back() == '/') path->pop_back();
  *port = 80;
  const size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos) {
    std::string_view port_text = authority.substr(colon + 1);
    if (!absl::SimpleAtoi(absl::string_view(port_text.data(), port_text.size()), port) ||
        *port <= 0 || *port > 65535) {
      return false;
    }
    authority = authority.substr(0, colon);
  }
  if (authority.size() > 2 && authority.front() == '[' && authority.back() == ']') {
    authority = authority.substr(1, authority.size() - 2);
  }
  *host = std::string(authority);
  return !host->empty();
}

std::optional<MetricsSnapshot> MetricsWatcher::Scrape(const std::string& url) {
  std::string host, path;
  int port = 0;
  if (!SplitHttpUrl(url, &host, &port, &path)) return std::nullopt;
  httplib::Client c(host, port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  httplib::Result r = c.Get(path.empty() ? "/" : path.c_str());
  if (!r || r->status != 200) return std::nullopt;
  return ExtractSnapshot(ParsePrometheusText(r->body));
}

MetricsWatcher::MetricsWatcher(std::string url, double interval_s)
    : url_(std::move(url)), interval_s_(interval_s) {}

MetricsWatcher::~MetricsWatcher() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void MetricsWatcher::Start() {
  if (url_.empty()) return;
  before_ = Scrape(url_);
  if (!before_.has_value()) return;
  {
    absl::MutexLock lock(&mu_);
    kv_peak_ = before_->kv_usage;
    running_peak_ = before_->running;
  }
  thread_ = std::thread([this] { Loop(); });
}

void MetricsWatcher::Loop() {
  std::string host, path;
  int port = 0;
  if (!SplitHttpUrl(url_, &host, &port, &path)) return;
  httplib::Client c(host, port);  // one kept-alive connection for all samples
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  const auto interval = std::chrono::duration<double>(interval_s_);
  while (!stop_) {
    const auto next = std::chrono::steady_clock::now() + interval;
    if (httplib::Result r = c.Get(path.c_str()); r && r->status == 200) {
      MetricsSnapshot m = ExtractSnapshot(ParsePrometheusText(r->body));
      absl::MutexLock lock(&mu_);
      kv_peak_ = Max(kv_peak_, m.kv_usage);
      running_peak_ = Max(running_peak_, m.running);
    }
    while (!stop_ && std::chrono::steady_clock::now() < next) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

ServerRunStats MetricsWatcher::Finish() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ServerRunStats s;
  if (!before_.has_value()) return s;
  std::optional<MetricsSnapshot> after = Scrape(url_);
  if (!after.has_value()) return s;
  const MetricsSnapshot& b = *before_;
  const MetricsSnapshot& a = *after;
  s.scraped = true;
  s.kv_usage_before = b.kv_usage;
  s.kv_usage_after = a.kv_usage;
  {
    absl::MutexLock lock(&mu_);
    s.kv_usage_peak = Max(kv_peak_, a.kv_usage);
    s.running_peak = Max(running_peak_, a.running);
  }
  s.kv_blocks = a.kv_blocks;
  s.prefix_query_tokens = Growth(b.prefix_queries, a.prefix_queries);
  s.prefix_hit_tokens = Growth(b.prefix_hits, a.prefix_hits);
  if (s.prefix_query_tokens.has_value() && s.prefix_hit_tokens.has_value()) {
    s.prefix_hit_rate =
        *s.prefix_query_tokens > 0 ? *s.prefix_hit_tokens / *s.prefix_query_tokens : 0.0;
  }
  s.preemptions = Growth(b.preemptions, a.preemptions);
  s.swap_out_blocks = Growth(b.swap_out, a.swap_out);
  s.prompt_tokens = Growth(b.prompt_tokens, a.prompt_tokens);
  s.generation_tokens = Growth(b.gen_tokens, a.gen_tokens);
  s.cpu_seconds = Growth(b.cpu_seconds, a.cpu_seconds);
  return s;
}

}  // namespace kvserve::bench
