// KV tiers on a multi-turn chat whose conversations come back after other
// traffic has filled the device pool: TTFT (p50, p99) of the returning
// turns and the share of their prompt tokens each tier served, for
// device-only, +host, +disk and +remote (a redis-server the bench starts on
// a free loopback port, when /usr/bin/redis-server exists). Every
// configuration must produce the same greedy tokens; the bench says so.
// One CPU engine per configuration; the served study (real daemons, two
// replicas behind nginx, a 3,000-token document) is
// bench/tier_serve_bench.sh.
//
//   tier_bench [MODEL] [--conversations 6] [--turns 3] [--filler 6]
//              [--num-blocks 40] [--kv-dtype int8] [--json FILE]
// MODEL defaults to stories260K in the shared folder ($KVSERVE_SHARED or
// shared/ beside the current directory or an ancestor).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/shared_file.h"
#include "cache/tier/remote_tier.h"
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
  int conversations = 6;
  int turns = 3;
  int filler = 6;
  int32_t num_blocks = 40;
  std::string kv_dtype = "int8";
};

// A redis-server of the bench's own (none when the package is missing).
struct Redis {
  pid_t pid = 0;
  std::string url;
  Redis() {
    if (access("/usr/bin/redis-server", X_OK) != 0) return;
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    const std::string port = std::to_string(ntohs(a.sin_port));
    const std::string dir = fs::temp_directory_path() / ("tier_bench_redis_" + port);
    fs::create_directories(dir);
    pid = fork();
    if (pid == 0) {
      execl("/usr/bin/redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
            "--dir", dir.c_str(), "--save", "", "--appendonly", "no", "--logfile",
            (dir + "/redis.log").c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    url = "redis://127.0.0.1:" + port + "/0";
    for (int i = 0; i < 500 && !PingRedis(url, 100).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Redis() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

struct Run {
  std::string name;
  std::vector<double> ttft_ms;  // returning turns
  int64_t prompt_tokens = 0;    // of the returning turns
  std::array<int64_t, kNumTiers> served{};
  std::vector<std::vector<int32_t>> outputs;  // every conversation turn, in order
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// One request: its tokens, and the time to its first event.
std::vector<int32_t> Generate(Engine& e, const std::vector<int32_t>& prompt, int max_tokens,
                              double* ttft_ms) {
  GenerateRequest r;
  r.prompt_token_ids = prompt;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  const auto start = Clock::now();
  auto stream = e.Submit(std::move(r));
  std::vector<int32_t> out;
  if (!stream.ok()) return out;
  GenerateOutput o;
  bool first = true;
  while ((*stream)->Next(&o) == RequestStream::Pop::kOutput) {
    if (first && ttft_ms != nullptr) {
      *ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    }
    first = false;
    out.insert(out.end(), o.token_ids.begin(), o.token_ids.end());
  }
  return out;
}

Run RunConfig(const std::string& name, const KvTierConfig& tiers, const Options& o,
              const LoadedModel& m, const std::shared_ptr<const Tokenizer>& tok,
              const std::vector<std::vector<int32_t>>& texts) {
  Run run;
  run.name = name;
  CpuRunnerOptions ro;
  ro.kv_dtype = *KvDtypeSpec::Parse(o.kv_dtype);
  ro.num_blocks = o.num_blocks;
  ro.num_threads = 1;
  auto runner = CpuModelRunner::Create(m.weights, ro);
  if (!runner.ok()) std::abort();
  EngineConfig ec;
  ec.tiers = tiers;
  ec.weights_fingerprint = "tier_bench";
  auto engine = Engine::Create(ec, std::move(*runner), tok);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(engine.status().message()).c_str());
    std::exit(1);
  }
  Engine& e = **engine;
  std::vector<std::vector<int32_t>> convo(o.conversations);
  size_t next_text = 0;
  auto text = [&] { return texts[next_text++ % texts.size()]; };
  for (int turn = 0; turn < o.turns; ++turn) {
    const EngineStats before = e.GetStats();
    for (int c = 0; c < o.conversations; ++c) {
      std::vector<int32_t> user = text();
      user.resize(std::min<size_t>(user.size(), 60));
      if (convo[c].empty()) convo[c].push_back(m.weights.config.bos_id);
      convo[c].insert(convo[c].end(), user.begin(), user.end());
      double ttft = 0;
      const std::vector<int32_t> reply = Generate(e, convo[c], 24, &ttft);
      run.outputs.push_back(reply);
      convo[c].insert(convo[c].end(), reply.begin(), reply.end());
      if (turn > 0) {
        run.ttft_ms.push_back(ttft);
        run.prompt_tokens += static_cast<int64_t>(convo[c].size() - reply.size());
      }
    }
    // Other traffic fills the device pool before the conversations return.
    for (int f = 0; f < o.filler; ++f) {
      std::vector<int32_t> p = {m.weights.config.bos_id};
      for (int k = 0; k < 4; ++k) {
        std::vector<int32_t> t = text();
        p.insert(p.end(), t.begin(), t.end());
      }
      p.resize(std::min<size_t>(p.size(), 300));
      Generate(e, p, 8, nullptr);
    }
    if (turn > 0) {
      const EngineStats after = e.GetStats();
      run.served[0] += after.kv.prefix_hit_tokens - before.kv.prefix_hit_tokens;
      for (int t = 1; t < kNumTiers; ++t) {
        run.served[t] += after.tiers[t].loaded_tokens - before.tiers[t].loaded_tokens;
      }
    }
  }
  return run;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--conversations") {
      o.conversations = std::stoi(next());
    } else if (a == "--turns") {
      o.turns = std::stoi(next());
    } else if (a == "--filler") {
      o.filler = std::stoi(next());
    } else if (a == "--num-blocks") {
      o.num_blocks = std::stoi(next());
    } else if (a == "--kv-dtype") {
      o.kv_dtype = next();
    } else if (a == "--json") {
      o.json = next();
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
  std::vector<std::vector<int32_t>> texts;
  std::ifstream in(SharedFile("data/tinystories_valid_dev.txt"));
  for (std::string line; std::getline(in, line) && texts.size() < 400;) {
    if (line.find("<|endoftext|>") != std::string::npos || line.size() < 40) continue;
    texts.push_back(tok->Encode(line, false));
  }
  if (texts.empty()) {
    std::fprintf(stderr, "no dev-set text found\n");
    return 1;
  }

  const std::string disk_dir =
      fs::temp_directory_path() / ("tier_bench_" + std::to_string(getpid()));
  fs::create_directories(disk_dir);
  Redis redis;
  std::vector<std::pair<std::string, KvTierConfig>> configs;
  configs.push_back({"device", {}});
  KvTierConfig host;
  host.host_bytes = int64_t{64} << 20;
  configs.push_back({"+host", host});
  KvTierConfig disk;
  disk.disk_path = disk_dir + "/kv.tier";
  disk.disk_bytes = int64_t{256} << 20;
  configs.push_back({"+disk", disk});
  if (!redis.url.empty()) {
    KvTierConfig remote;
    remote.remote_url = redis.url;
    configs.push_back({"+remote", remote});
  }

  std::printf(
      "tier_bench: %s, %s pages, %d-block pool, %d conversations x %d turns, %d filler "
      "prompts between turns\n",
      m->weights.config.name.c_str(), o.kv_dtype.c_str(), o.num_blocks, o.conversations, o.turns,
      o.filler);
  std::printf("%-8s %10s %10s %8s %8s %8s %8s %10s\n", "config", "ttft_p50", "ttft_p99", "device",
              "host", "disk", "remote", "same_text");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<int32_t>> reference;
  for (const auto& [name, tiers] : configs) {
    const Run r = RunConfig(name, tiers, o, *m, tok, texts);
    if (reference.empty()) reference = r.outputs;
    const bool same = r.outputs == reference;
    auto share = [&](int t) {
      return r.prompt_tokens > 0 ? static_cast<double>(r.served[t]) / r.prompt_tokens : 0.0;
    };
    std::printf("%-8s %8.2fms %8.2fms %7.1f%% %7.1f%% %7.1f%% %7.1f%% %10s\n", name.c_str(),
                Percentile(r.ttft_ms, 0.5), Percentile(r.ttft_ms, 0.99), 100 * share(0),
                100 * share(1), 100 * share(2), 100 * share(3), same ? "yes" : "NO");
    rows.push_back(
        {{"config", name},
         {"ttft_p50_ms", Percentile(r.ttft_ms, 0.5)},
         {"ttft_p99_ms", Percentile(r.ttft_ms, 0.99)},
         {"hit_rate",
          {{"device", share(0)}, {"host", share(1)}, {"disk", share(2)}, {"remote", share(3)}}},
         {"same_tokens", same}});
  }
  fs::remove_all(disk_dir);
  if (!o.json.empty()) {
    std::ofstream(o.json) << nlohmann::json{{"configs", rows}}.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) { return kvserve::Main(argc, argv); }
