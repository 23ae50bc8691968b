// kvserve_bench: a serving benchmark that drives a running server over the
// OpenAI HTTP API (/v1/completions or /v1/chat/completions, streamed so it
// sees every token arrive) or kvserve's gRPC Generate stream, closed loop
// (fixed concurrency) or open loop (Poisson arrivals), over a sweep of
// concurrencies or rates. It reports requests/s, output tokens/s, TTFT,
// TPOT, ITL and end-to-end latency percentiles, and from the server's
// /metrics before, during and after each run: KV usage, sequences running,
// prefix-cache hit rate and preemptions. A table goes to stdout, JSON (schema
// bench/kvserve_bench_schema.json) to --json. See bench/README.md.
//
//   kvserve_bench --url http://127.0.0.1:8000 --workload sharegpt
//                 --concurrency 1,4,16 --num-prompts 200 --json out.json
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/client.h"
#include "bench/loadgen/load.h"
#include "bench/loadgen/probe.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/server_metrics.h"
#include "bench/loadgen/workload.h"
#include "bench/shared_file.h"
#include "model/tokenizer/hf_tokenizer.h"
#include "proto/kvserve.grpc.pb.h"

namespace kvserve::bench {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::kvserve::v1;
using json = nlohmann::json;

constexpr char kUsage[] = R"(usage: kvserve_bench [options]
Drives a running OpenAI-compatible or kvserve gRPC server and reports throughput and latency.

target
  --url URL              HTTP server base (default http://127.0.0.1:8000; a trailing /v1 is ok)
  --api API              completions | chat | grpc (default completions)
  --grpc-target H:P      gRPC address (needed for --api grpc; adds a gRPC case to --probe)
  --model NAME           the model field (default: the first of GET /v1/models)
  --api-key KEY          sent as "Authorization: Bearer KEY" (default $OPENAI_API_KEY)
  --metrics-url URL      Prometheus text to scrape (default URL/metrics, with --api grpc only
                         when --url is given; "none" to skip)
  --stream BOOL          stream responses (default true; false: TTFT = E2E)
  --extra-body JSON      fields merged into every HTTP request body, e.g. '{"cache_prompt":false}'
workload
  --workload KIND        fixed | sharegpt | shared-prefix | long-context | long-document |
                         multi-turn (default fixed)
  --num-prompts N        requests per run (default 100; with --duration: unlimited)
  --input-len N          prompt tokens (sharegpt: median) (default 64)
  --output-len N         output tokens (sharegpt: median) (default 64)
  --input-sigma S        sharegpt: log-space sigma of prompt lengths (default 1.0)
  --output-sigma S       sharegpt: log-space sigma of output lengths (default 0.8)
  --min-len N            sharegpt: shortest prompt or output (default 4)
  --groups G             shared-prefix: groups; long-document: documents; multi-turn:
                         conversations (default 4)
  --prefix-len N         shared-prefix: common prefix tokens per group; long-document: a
                         document's tokens; multi-turn: a first turn's (default 256)
  --suffix-len N         shared-prefix: distinct suffix tokens per request; long-document: a
                         question's; multi-turn: the tokens each later turn adds (default 16)
  --max-model-len N      context length (default: what /v1/models or GetModelInfo says)
  --dataset FILE         prompt text (default shared/data/tinystories_valid_dev.txt)
  --tokenizer FILE|DIR   the served model's tokenizer (.model, tokenizer.json or an HF dir):
                         exact prompt lengths; without it lengths are estimated
  --chars-per-token X    the estimate without a tokenizer (default auto: measured with one
                         request whose usage.prompt_tokens the server reports; else 4)
  --token-ids BOOL       send prompts as token ids (needs --tokenizer) (default false)
  --ignore-eos BOOL      generate exactly the output length (default true)
  --temperature T        (default 0)
  --seed N               workload and arrival seed (default 0)
load
  --concurrency LIST     closed loop, one run per level, e.g. 1,2,4,8 (default 1, or no
                         load runs when --probe is given alone)
  --request-rate LIST    open loop, requests/s per run, e.g. 2,4,8 (0: all at once)
  --max-concurrency N    open loop: requests in flight at most (default 64)
  --duration S           stop sending after S seconds per run (default: none)
  --warmup N             unmeasured short requests before the first run (default 2)
  --probe N              also compare fresh and kept-alive connection latency of a
                         1-token completion, N requests of each (default 0: off)
output
  --label NAME           names this configuration in the JSON and plots
  --json FILE            write the results as JSON
  --requests-json FILE   write every request's timings, group, turn and output text as JSON
  --progress WHEN        auto | always | never: progress bar on stderr (default auto: a tty)
)";

struct Options {
  ClientOptions client;
  WorkloadSpec workload;
  bool url_given = false;
  bool num_prompts_given = false;
  std::string dataset;
  std::string tokenizer;
  double chars_per_token = 0;  // 0: measure (auto)
  std::vector<int> concurrency;
  std::vector<double> request_rates;
  int max_concurrency = 64;
  double duration_s = 0;
  int warmup = 2;
  int probe = 0;
  std::string metrics_url;
  std::string label;
  std::string json_path;
  std::string requests_json_path;
  std::string progress = "auto";
};

// shared/<rel> beside the current directory or an ancestor, or under
// $KVSERVE_SHARED.
using bench::SharedFile;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "kvserve_bench: %s\n(run 'kvserve_bench --help' for usage)\n",
               message.c_str());
  return 2;
}

bool ParseBool(const std::string& v, bool* out) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "false" || v == "0" || v == "no" || v == "off") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

// Returns -1 to go on, or an exit code.
int ParseArgs(int argc, char** argv, Options* o) {
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr) o->client.api_key = key;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!arg.starts_with("--")) return UsageError("unexpected argument '" + arg + "'");
    std::string name = arg, value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return UsageError(arg + " needs a value");
    }
    auto bad = [&](const std::string& want) {
      return UsageError(name + ": '" + value + "' is not " + want);
    };
    int64_t n = 0;
    double d = 0;
    auto positive_int = [&](int* out, int64_t lo) {
      if (!absl::SimpleAtoi(value, &n) || n < lo || n > (1 << 30)) return false;
      *out = static_cast<int>(n);
      return true;
    };
    if (name == "--url") {
      o->client.url = value;
      o->url_given = true;
    } else if (name == "--api") {
      if (value == "completions") {
        o->client.api = Api::kCompletions;
      } else if (value == "chat") {
        o->client.api = Api::kChat;
      } else if (value == "grpc") {
        o->client.api = Api::kGrpc;
      } else {
        return bad("one of completions, chat, grpc");
      }
    } else if (name == "--grpc-target") {
      o->client.grpc_target = value;
    } else if (name == "--model") {
      o->client.model = value;
    } else if (name == "--api-key") {
      o->client.api_key = value;
    } else if (name == "--metrics-url") {
      o->metrics_url = value;
    } else if (name == "--stream") {
      if (!ParseBool(value, &o->client.stream)) return bad("true or false");
    } else if (name == "--extra-body") {
      json j = json::parse(value, nullptr, false);
      if (!j.is_object()) return bad("a JSON object");
      o->client.extra_body = j;
    } else if (name == "--workload") {
      absl::StatusOr<WorkloadKind> k = ParseWorkloadKind(value);
      if (!k.ok()) return UsageError(std::string(k.status().message()));
      o->workload.kind = *k;
    } else if (name == "--num-prompts") {
      if (!positive_int(&o->workload.num_requests, 1)) return bad("an integer >= 1");
      o->num_prompts_given = true;
    } else if (name == "--input-len") {
      if (!positive_int(&o->workload.input_len, 1)) return bad("an integer >= 1");
    } else if (name == "--output-len") {
      if (!positive_int(&o->workload.output_len, 1)) return bad("an integer >= 1");
    } else if (name == "--input-sigma" || name == "--output-sigma") {
      if (!absl::SimpleAtod(value, &d) || !(d >= 0 && d < 10)) return bad("a number in [0, 10)");
      (name == "--input-sigma" ? o->workload.input_sigma : o->workload.output_sigma) = d;
    } else if (name == "--min-len") {
      if (!positive_int(&o->workload.min_len, 1)) return bad("an integer >= 1");
    } else if (name == "--groups") {
      if (!positive_int(&o->workload.groups, 1)) return bad("an integer >= 1");
    } else if (name == "--prefix-len") {
      if (!positive_int(&o->workload.prefix_len, 1)) return bad("an integer >= 1");
    } else if (name == "--suffix-len") {
      if (!positive_int(&o->workload.suffix_len, 1)) return bad("an integer >= 1");
    } else if (name == "--max-model-len") {
      if (!positive_int(&o->workload.max_model_len, 1)) return bad("an integer >= 1");
    } else if (name == "--dataset") {
      o->dataset = value;
    } else if (name == "--tokenizer") {
      o->tokenizer = value;
    } else if (name == "--chars-per-token") {
      if (value == "auto") {
        o->chars_per_token = 0;
      } else if (!absl::SimpleAtod(value, &d) || !(d > 0)) {
        return bad("a number > 0 or auto");
      } else {
        o->chars_per_token = d;
      }
    } else if (name == "--token-ids") {
      if (!ParseBool(value, &o->client.send_token_ids)) return bad("true or false");
    } else if (name == "--ignore-eos") {
      if (!ParseBool(value, &o->client.ignore_eos)) return bad("true or false");
    } else if (name == "--temperature") {
      if (!absl::SimpleAtod(value, &d) || d < 0) return bad("a number >= 0");
      o->client.temperature = d;
    } else if (name == "--seed") {
      if (!absl::SimpleAtoi(value, &o->workload.seed)) return bad("a non-negative integer");
    } else if (name == "--concurrency") {
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 100000) {
          return bad("a list of integers >= 1");
        }
        o->concurrency.push_back(static_cast<int>(n));
      }
    } else if (name == "--request-rate") {
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        if (!absl::SimpleAtod(part, &d) || !(d >= 0) || std::isinf(d)) {
          return bad("a list of rates >= 0");
        }
        o->request_rates.push_back(d);
      }
    } else if (name == "--max-concurrency") {
      if (!positive_int(&o->max_concurrency, 1)) return bad("an integer >= 1");
    } else if (name == "--duration") {
      if (!absl::SimpleAtod(value, &d) || !(d > 0)) return bad("a number of seconds > 0");
      o->duration_s = d;
    } else if (name == "--warmup") {
      if (!positive_int(&o->warmup, 0)) return bad("an integer >= 0");
    } else if (name == "--probe") {
      if (!positive_int(&o->probe, 0)) return bad("an integer >= 0");
    } else if (name == "--label") {
      o->label = value;
    } else if (name == "--json") {
      o->json_path = value;
    } else if (name == "--requests-json") {
      o->requests_json_path = value;
    } else if (name == "--progress") {
      if (value != "auto" && value != "always" && value != "never") {
        return bad("one of auto, always, never");
      }
      o->progress = value;
    } else {
      return UsageError("unknown flag '" + name + "'");
    }
  }
  if (o->client.api == Api::kGrpc && o->client.grpc_target.empty()) {
    return UsageError("--api grpc needs --grpc-target HOST:PORT");
  }
  if (o->client.send_token_ids && o->tokenizer.empty()) {
    return UsageError("--token-ids true needs --tokenizer");
  }
  if (!o->concurrency.empty() && !o->request_rates.empty()) {
    return UsageError("--concurrency and --request-rate: give one (closed or open loop)");
  }
  // --probe alone measures only the connections.
  if (o->concurrency.empty() && o->request_rates.empty() && o->probe == 0) o->concurrency = {1};
  if (o->dataset.empty()) o->dataset = SharedFile("data/tinystories_valid_dev.txt");
  return -1;
}

// The served model's name and context length: GET /v1/models (kvserve and
// vLLM report max_model_len there), or GetModelInfo over gRPC.
void Discover(Options* o, int* max_model_len) {
  if (o->client.api == Api::kGrpc) {
    auto stub = v1::Generation::NewStub(
        grpc::CreateChannel(o->client.grpc_target, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfo info;
    if (stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok()) {
      if (o->client.model.empty()) o->client.model = info.name();
      *max_model_len = info.max_model_len();
    }
    return;
  }
  std::string host, path;
  int port = 0;
  if (!SplitHttpUrl(o->client.url, &host, &port, &path)) return;
  if (path.ends_with("/v1")) path.resize(path.size() - 3);
  httplib::Client c(host, port);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!o->client.api_key.empty()) headers.emplace("Authorization", "Bearer " + o->client.api_key);
  httplib::Result r = c.Get((path + "/v1/models").c_str(), headers);
  if (!r || r->status != 200) return;
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) return;
  const json& m = j["data"][0];
  if (o->client.model.empty() && m.contains("id") && m["id"].is_string()) {
    o->client.model = m["id"].get<std::string>();
  }
  if (m.contains("max_model_len") && m["max_model_len"].is_number_integer()) {
    *max_model_len = m["max_model_len"].get<int>();
  }
}

// Characters per token of the served model's tokenizer on the corpus: one
// 1-token request with a known amount of corpus text, and the server's
// usage.prompt_tokens. 4 (a common English figure) when the server reports
// no usage.
double MeasureCharsPerToken(const Options& o, int max_model_len) {
  constexpr double kFallback = 4.0;
  absl::StatusOr<PromptSource> plain = PromptSource::FromFile(o.dataset, nullptr, 1.0);
  if (!plain.ok()) return kFallback;
  // At least one character per token, so this many fit in the context.
  const int chars = max_model_len > 0 ? std::min(2000, max_model_len - 8) : 1000;
  if (chars < 64) return kFallback;
  std::mt19937_64 rng(o.workload.seed + 1);
  BenchRequest probe;
  probe.prompt = plain->Take(chars, rng).text;
  probe.max_tokens = 1;
  ClientOptions c = o.client;
  if (c.api == Api::kChat) c.api = Api::kCompletions;  // no chat template around the text
  c.stream = false;
  c.send_token_ids = false;
  RequestResult r = MakeClient(c, /*keep_alive=*/false)->Send(probe);
  if (!r.ok || r.prompt_tokens <= 1) return kFallback;
  return static_cast<double>(probe.prompt.size()) / static_cast<double>(r.prompt_tokens - 1);
}

int Run(int argc, char** argv) {
  Options o;
  if (int rc = ParseArgs(argc, argv, &o); rc >= 0) return rc;
  const bool progress = o.progress == "always" || (o.progress == "auto" && isatty(2));

  int server_max_len = 0;
  Discover(&o, &server_max_len);
  if (o.workload.max_model_len == 0) o.workload.max_model_len = server_max_len;

  std::unique_ptr<Tokenizer> tokenizer;
  if (!o.tokenizer.empty()) {
    absl::StatusOr<LoadedTokenizer> t = fs::is_directory(o.tokenizer)
                                            ? LoadHfDirectoryTokenizer(o.tokenizer)
                                            : LoadTokenizerFile(o.tokenizer);
    if (!t.ok()) return UsageError("--tokenizer: " + std::string(t.status().message()));
    tokenizer = std::move(t->tokenizer);
  }
  if (tokenizer == nullptr && o.chars_per_token == 0) {
    o.chars_per_token = MeasureCharsPerToken(o, o.workload.max_model_len);
  }
  absl::StatusOr<PromptSource> source = PromptSource::FromFile(
      o.dataset, tokenizer.get(), o.chars_per_token > 0 ? o.chars_per_token : 4.0);
  if (!source.ok()) return UsageError(std::string(source.status().message()));
  WorkloadSpec spec = o.workload;
  // With a time limit and no count, the workload is a pool that runs cycle through.
  if (o.duration_s > 0 && !o.num_prompts_given) spec.num_requests = 200;
  absl::StatusOr<std::vector<BenchRequest>> workload = BuildWorkload(spec, *source);
  if (!workload.ok()) return UsageError(std::string(workload.status().message()));

  BenchReport report;
  report.label = o.label;
  report.started_at = UtcNowIso8601();
  report.client = o.client;
  report.max_model_len = o.workload.max_model_len;
  report.workload = o.workload;
  report.dataset = o.dataset;
  report.tokenizer = o.tokenizer;
  report.chars_per_token = tokenizer == nullptr ? o.chars_per_token : 0;

  const ClientOptions client_options = o.client;
  ClientFactory factory = [&client_options] { return MakeClient(client_options, true); };
  if (o.warmup > 0) {
    BenchRequest warm;
    warm.prompt = "Once upon a time";
    warm.max_tokens = 4;
    std::unique_ptr<Client> c = factory();
    for (int i = 0; i < o.warmup; ++i) {
      RequestResult r = c->Send(warm);
      if (!r.ok) {
        std::fprintf(stderr, "kvserve_bench: the warm-up request failed: %s\n", r.error.c_str());
        return 1;
      }
    }
  }

  std::string metrics_url = o.metrics_url;
  if (metrics_url == "none") {
    metrics_url.clear();
  } else if (metrics_url.empty() && (o.client.api != Api::kGrpc || o.url_given)) {
    std::string base = o.client.url;
    while (base.ends_with("/")) base.pop_back();
    if (base.ends_with("/v1")) base.resize(base.size() - 3);
    metrics_url = base + "/metrics";
  }

  std::vector<LoadSpec> loads;
  for (int c : o.concurrency) {
    LoadSpec l;
    l.mode = LoadSpec::Mode::kClosed;
    l.concurrency = c;
    loads.push_back(l);
  }
  for (double rate : o.request_rates) {
    LoadSpec l;
    l.mode = LoadSpec::Mode::kOpen;
    l.request_rate = rate;
    l.max_concurrency = o.max_concurrency;
    loads.push_back(l);
  }
  int64_t failed = 0;
  nlohmann::ordered_json requests = nlohmann::ordered_json::array();
  for (LoadSpec& l : loads) {
    l.num_requests = o.duration_s > 0 && !o.num_prompts_given ? 0 : o.workload.num_requests;
    l.duration_s = o.duration_s;
    l.seed = o.workload.seed;
    MetricsWatcher watcher(metrics_url);
    watcher.Start();
    ProgressOptions p;
    p.enabled = progress;
    p.label = l.mode == LoadSpec::Mode::kClosed ? absl::StrCat("c=", l.concurrency)
                                                : absl::StrCat("rate=", l.request_rate);
    LoadResult result = RunLoad(l, *workload, factory, p);
    if (!o.requests_json_path.empty()) {
      const int run = static_cast<int>(report.runs.size());
      for (auto& r : RequestRecords(run, result, *workload)) requests.push_back(std::move(r));
    }
    report.runs.push_back(Aggregate(l, result, watcher.Finish()));
    failed += report.runs.back().failed;
  }
  if (o.probe > 0) {
    report.probe_ran = true;
    report.probe_requests = o.probe;
    report.probe = RunConnectionProbe(o.client, o.probe, o.client.api != Api::kGrpc, progress);
    for (const ProbeCase& c : report.probe) failed += c.failed;
  }

  std::fputs(FormatTable(report).c_str(), stdout);
  std::fflush(stdout);
  using Doc = std::pair<std::string, nlohmann::ordered_json>;
  for (const auto& [path, doc] :
       {Doc{o.json_path, ToJson(report)}, Doc{o.requests_json_path, std::move(requests)}}) {
    if (path.empty()) continue;
    std::ofstream out(path);
    out << doc.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "kvserve_bench: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace kvserve::bench

int main(int argc, char** argv) { return kvserve::bench::Run(argc, argv); }
