// Engine throughput on a real checkpoint (stories260K by default): total
// generated tokens/s with 1, 8, 32 and 64 requests in flight, each a
// 32-token prompt (BOS + 31 tokens of dev-set text) and 128 new tokens
// (greedy, ignore_eos, so every request has the same length). Each level
// keeps `concurrency` requests in flight (a new one is submitted as soon as
// one finishes) and counts generated tokens over --seconds after a 0.3 s
// warm-up; requests go through Submit and their RequestStreams exactly as a
// front end's would.
// Prints a table (tokens/s, mean batch, TTFT, TPOT, and what those give at
// one request in flight: prefill tokens/s = prompt tokens / TTFT, decode
// tokens/s = 1 / TPOT) and writes JSON. --threads takes a list (1,2): each
// level runs at each thread count, to show how the CPU forward pass scales.
// At real size (dummy:stories110m-shape, bench/README.md), e.g.
//   engine_bench dummy:stories110m-shape --levels 1 --threads 1,2
//     --prompt-tokens 169 --max-tokens 64 --seconds 20
//
//   engine_bench [MODEL] [--json FILE] [--seconds S] [--threads N[,N...]]
//                [--levels 1,8,32,64] [--prompt-tokens 32] [--max-tokens 128]
//                [--block-size 16] [--temperature T] [--schema JSON]
// --schema constrains every request to a JSON schema (docs/structured-outputs.md);
// a sample then ends where its JSON does, so requests differ in length.
// MODEL defaults to $KVSERVE_SHARED/models/stories260k/stories260K.bin, else
// shared/models/stories260k beside the current directory or an ancestor.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "bench/shared_file.h"
#include "cache/sizing/block_count.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/loader/model_loader.h"
#include "scheduler/engine.h"

namespace kvserve {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using bench::SharedFile;

struct Options {
  std::string model;
  std::string json;
  double seconds = 3.0;
  std::vector<int> threads = {0};  // 0: what the cgroup allows
  std::vector<int> levels = {1, 8, 32, 64};
  int prompt_tokens = 32;
  int max_tokens = 128;
  int block_size = 16;
  float temperature = 0.0f;
  std::string schema;  // --schema: every request constrained to this JSON schema
};

struct LevelResult {
  int concurrency = 0;
  int threads = 0;
  int requests = 0;
  int64_t generated = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double mean_batch = 0;
  double ttft_p50_ms = 0;
  double tpot_mean_ms = 0;
  double prefill_tokens_per_s = 0;  // prompt tokens / TTFT p50
  double decode_tokens_per_s = 0;   // 1 / mean TPOT
  int64_t steps = 0;
  double cpu_seconds = 0;
};

// CPU seconds of the whole process (every thread): on a shared machine,
// tokens per CPU second is steadier than tokens per wall second.
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

// Prompts of exactly prompt_tokens tokens (BOS first) from dev-set text, all
// different so the prefix cache cannot shortcut the prefill.
std::vector<std::vector<int32_t>> MakePrompts(const Tokenizer& tok, int count, int len) {
  std::vector<int32_t> ids;
  std::ifstream in(SharedFile("data/tinystories_valid_dev.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("<|endoftext|>") != std::string::npos || line.empty()) continue;
    std::vector<int32_t> t = tok.Encode(line, false);
    ids.insert(ids.end(), t.begin(), t.end());
  }
  if (ids.size() < 1000) {
    for (int i = 0; i < 100000; ++i) ids.push_back(3 + (i * 7919) % 500);  // no data: synthetic
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p = {tok.bos_id()};
    const size_t start = (static_cast<size_t>(i) * 977) % (ids.size() - len);
    p.insert(p.end(), ids.begin() + start, ids.begin() + start + len - 1);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Wakes the collecting thread when any stream has news (runs on the engine
// thread; must not block).
struct Notifier {
  absl::Mutex mu;
  uint64_t count ABSL_GUARDED_BY(mu) = 0;
  void Notify() {
    absl::MutexLock lock(&mu);
    ++count;
  }
};

// Closed loop: `concurrency` requests are always in flight; whenever one
// finishes another is submitted. Tokens are counted over a measuring window
// that starts after a warm-up, so the numbers are steady-state throughput.
LevelResult RunLevel(const Options& o, const LoadedModel& m, std::shared_ptr<const Tokenizer> tok,
                     int concurrency, int threads) {
  CpuRunnerOptions ro;
  ro.block_size = o.block_size;
  ro.num_threads = threads;
  const int per_seq = BlocksForTokens(o.prompt_tokens + o.max_tokens, o.block_size) + 1;
  ro.num_blocks = std::max(per_seq * concurrency,
                           BlocksForTokens(m.weights.config.max_position_embeddings, o.block_size));
  auto runner = CpuModelRunner::Create(m.weights, ro);
  if (!runner.ok()) {
    std::fprintf(stderr, "runner: %s\n", std::string(runner.status().message()).c_str());
    std::exit(1);
  }
  std::atomic<bool> measuring{false};
  absl::Mutex mu;
  std::vector<double> ttft, tpot;
  EngineConfig config;
  config.max_num_seqs = std::max(concurrency, 1);
  config.max_num_batched_tokens = std::max(512, concurrency);
  config.on_request_finished = [&](const RequestMetrics& rm) {
    if (!measuring.load(std::memory_order_relaxed)) return;
    absl::MutexLock lock(&mu);
    ttft.push_back(rm.ttft_s);
    tpot.push_back(rm.tpot_s);
  };
  const int runner_threads = (*runner)->num_threads();
  auto engine = Engine::Create(config, std::move(*runner), tok);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    std::exit(1);
  }
  const auto prompts = MakePrompts(*tok, 4096, o.prompt_tokens);
  Notifier notifier;
  int next_prompt = 0;
  auto submit = [&]() {
    GenerateRequest req;
    req.prompt_token_ids = prompts[next_prompt++ % prompts.size()];
    req.max_tokens = o.max_tokens;
    req.ignore_eos = true;
    req.sampling.temperature = o.temperature;
    req.sampling.seed = next_prompt;
    if (!o.schema.empty()) {
      req.constraint.kind = GrammarSpec::Kind::kJsonSchema;
      req.constraint.text = o.schema;
      req.constraint.field = "--schema";
    }
    auto s = (*engine)->Submit(std::move(req));
    if (!s.ok()) {
      std::fprintf(stderr, "submit: %s\n", std::string(s.status().message()).c_str());
      std::exit(1);
    }
    (*s)->SetNotify([&notifier] { notifier.Notify(); });
    return *s;
  };

  LevelResult r;
  r.concurrency = concurrency;
  r.threads = runner_threads;
  const double warmup_s = 0.3;
  const auto t_start = Clock::now();
  const auto t_measure = t_start + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(warmup_s));
  const auto t_end = t_measure + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(o.seconds));
  std::vector<std::shared_ptr<RequestStream>> slots;
  for (int i = 0; i < concurrency; ++i) slots.push_back(submit());
  EngineStats before;
  double cpu0 = 0;
  uint64_t seen = 0;
  GenerateOutput out;
  for (;;) {
    const auto now = Clock::now();
    if (!measuring && now >= t_measure) {
      measuring = true;
      before = (*engine)->GetStats();
      cpu0 = ProcessCpuSeconds();
    }
    if (now >= t_end) break;
    {
      absl::MutexLock lock(&notifier.mu);
      seen = notifier.count;
    }
    for (auto& slot : slots) {
      RequestStream::Pop pop;
      while ((pop = slot->TryNext(&out)) == RequestStream::Pop::kOutput) {
        if (measuring) r.generated += static_cast<int64_t>(out.token_ids.size());
        if (out.request_finished && measuring) ++r.requests;
      }
      if (pop == RequestStream::Pop::kEnd) slot = submit();
    }
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(notifier.mu) {
      return notifier.count != seen;
    };
    notifier.mu.LockWhenWithTimeout(absl::Condition(&changed), absl::Milliseconds(5));
    notifier.mu.Unlock();
  }
  const EngineStats after = (*engine)->GetStats();
  r.seconds = std::chrono::duration<double>(Clock::now() - t_measure).count();
  r.cpu_seconds = ProcessCpuSeconds() - cpu0;
  measuring = false;
  for (auto& slot : slots) slot->Cancel();
  for (auto& slot : slots) {
    while (slot->Next(&out) == RequestStream::Pop::kOutput) {
    }
  }
  r.steps = after.steps - before.steps;
  r.tokens_per_s = r.generated / r.seconds;
  r.mean_batch = r.steps > 0 ? double(after.batched_seqs - before.batched_seqs) / r.steps : 0;
  absl::MutexLock lock(&mu);
  r.ttft_p50_ms = 1e3 * Percentile(ttft, 0.5);
  double sum = 0;
  for (double v : tpot) sum += v;
  r.tpot_mean_ms = tpot.empty() ? 0 : 1e3 * sum / tpot.size();
  r.prefill_tokens_per_s = r.ttft_p50_ms > 0 ? o.prompt_tokens / (r.ttft_p50_ms * 1e-3) : 0;
  r.decode_tokens_per_s = r.tpot_mean_ms > 0 ? 1e3 / r.tpot_mean_ms : 0;
  return r;
}

// "1,8,32" -> {1, 8, 32}.
std::vector<int> ParseIntList(const std::string& v) {
  std::vector<int> out;
  for (size_t p = 0; p < v.size();) {
    size_t c = v.find(',', p);
    if (c == std::string::npos) c = v.size();
    out.push_back(std::stoi(v.substr(p, c - p)));
    p = c + 1;
  }
  return out;
}

int Main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles
  // unless told not to; a server would turn that off too.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") {
      o.json = next();
    } else if (a == "--seconds") {
      o.seconds = std::stod(next());
    } else if (a == "--threads") {
      o.threads = ParseIntList(next());
    } else if (a == "--prompt-tokens") {
      o.prompt_tokens = std::stoi(next());
    } else if (a == "--max-tokens") {
      o.max_tokens = std::stoi(next());
    } else if (a == "--block-size") {
      o.block_size = std::stoi(next());
    } else if (a == "--temperature") {
      o.temperature = std::stof(next());
    } else if (a == "--schema") {
      o.schema = next();
    } else if (a == "--levels") {
      o.levels = ParseIntList(next());
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    } else {
      o.model = a;
    }
  }
  if (o.model.empty()) o.model = SharedFile("models/stories260k/stories260K.bin");
  auto m = LoadModel(o.model);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  std::shared_ptr<const Tokenizer> tok(std::move(m->tokenizer));

  std::printf("engine_bench: %s, %d-token prompts, %d new tokens, block size %d, %s\n",
              m->weights.config.name.c_str(), o.prompt_tokens, o.max_tokens, o.block_size,
              o.temperature == 0 ? "greedy" : "sampled");
  std::printf("%11s %7s %9s %10s %8s %10s %12s %10s %10s %9s %11s %10s\n", "concurrency", "threads",
              "requests", "generated", "seconds", "tokens/s", "tok/cpu_s", "mean_batch", "ttft_p50",
              "tpot_ms", "prefill/s", "decode/s");
  nlohmann::json levels = nlohmann::json::array();
  for (int c : o.levels) {
    for (int threads : o.threads) {
      LevelResult r = RunLevel(o, *m, tok, c, threads);
      std::printf("%11d %7d %9d %10lld %8.2f %10.0f %12.0f %10.1f %8.2fms %9.3f %11.0f %10.1f\n",
                  r.concurrency, r.threads, r.requests, static_cast<long long>(r.generated),
                  r.seconds, r.tokens_per_s, r.generated / std::max(r.cpu_seconds, 1e-9),
                  r.mean_batch, r.ttft_p50_ms, r.tpot_mean_ms, r.prefill_tokens_per_s,
                  r.decode_tokens_per_s);
      std::fflush(stdout);
      levels.push_back({{"concurrency", r.concurrency},
                        {"threads", r.threads},
                        {"requests", r.requests},
                        {"generated_tokens", r.generated},
                        {"seconds", r.seconds},
                        {"tokens_per_s", r.tokens_per_s},
                        {"cpu_seconds", r.cpu_seconds},
                        {"steps", r.steps},
                        {"mean_batch", r.mean_batch},
                        {"ttft_p50_ms", r.ttft_p50_ms},
                        {"tpot_mean_ms", r.tpot_mean_ms},
                        {"prefill_tokens_per_s", r.prefill_tokens_per_s},
                        {"decode_tokens_per_s", r.decode_tokens_per_s}});
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j = {{"benchmark", "engine_bench"},
                        {"model", m->weights.config.name},
                        {"prompt_tokens", o.prompt_tokens},
                        {"max_tokens", o.max_tokens},
                        {"block_size", o.block_size},
                        {"temperature", o.temperature},
                        {"schema", o.schema},
                        {"threads", o.threads},  // as asked; each level has what it got
                        {"levels", levels}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) { return kvserve::Main(argc, argv); }
