// `kvserve serve`: parses --config / --set, then runs the daemon.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "cache/tier/remote_tier.h"
#include "server/cli/commands.h"
#include "server/config/config.h"
#include "server/daemon.h"
#include "server/engine_builder.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve serve [--config FILE] [--set key.path=value ...] [--check]\n"
    "\n"
    "Runs the daemon: the OpenAI-compatible HTTP API (/v1/completions,\n"
    "/v1/chat/completions, /v1/models, /health, /metrics) and the gRPC API\n"
    "(kvserve.v1.Generation, grpc.health.v1, reflection v1 and v1alpha).\n"
    "\n"
    "  --config FILE        YAML config (see configs/default.yaml)\n"
    "  --set key.path=VAL   override one key after the file, e.g. --set cache.block_size=32\n"
    "  --check              validate the config, print the result and exit\n"
    "\n"
    "SIGTERM or SIGINT drains: new requests get 503 / UNAVAILABLE, in-flight ones\n"
    "finish within server.shutdown_timeout, then the daemon exits 0.\n"
    "\n"
    "Keys:\n";

void PrintUsage(FILE* out) {
  std::fputs(kUsage, out);
  for (const std::string& key : ServeConfigKeys()) {
    std::fprintf(out, "  %-34s %s\n", key.c_str(), ServeConfigKeyHelp(key).c_str());
  }
}

// Tier settings that may not work where the daemon runs: warnings, not
// refusals (a Redis that is down now is recomputed around at run time).
void WarnAboutTiers(const ServeConfig& c) {
  const std::string& disk = c.cache.disk_tier_path;
  if (!disk.empty()) {
    const std::filesystem::path dir = std::filesystem::path(disk).parent_path();
    const std::string d = dir.empty() ? "." : dir.string();
    if (access(d.c_str(), W_OK) != 0) {
      std::fprintf(stderr, "kvserve serve: warning: cache.disk_tier_path: %s is not writable\n",
                   d.c_str());
    }
  }
  if (!c.cache.remote_tier_url.empty()) {
    if (absl::Status s = PingRedis(c.cache.remote_tier_url, c.cache.tier_load_timeout_ms);
        !s.ok()) {
      std::fprintf(stderr, "kvserve serve: warning: cache.remote_tier_url: %s\n",
                   std::string(s.message()).c_str());
    }
  }
}

}  // namespace

int RunServe(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string_view flag) -> const char* {
      if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag &&
          arg[flag.size()] == '=') {
        return argv[i] + flag.size() + 1;
      }
      if (arg == flag && i + 1 < argc) return argv[++i];
      return nullptr;
    };
    if (arg == "--help" || arg == "-h") {
      PrintUsage(stdout);
      return 0;
    } else if (arg == "--check") {
      check = true;
    } else if (arg.starts_with("--config")) {
      const char* v = value("--config");
      if (v == nullptr) {
        std::fprintf(stderr, "kvserve serve: --config needs a file\n");
        return 2;
      }
      config_path = v;
    } else if (arg.starts_with("--set")) {
      const char* v = value("--set");
      if (v == nullptr) {
        std::fprintf(stderr, "kvserve serve: --set needs key.path=value\n");
        return 2;
      }
      overrides.emplace_back(v);
    } else {
      std::fprintf(stderr, "kvserve serve: unknown argument '%s'\n\n", argv[i]);
      PrintUsage(stderr);
      return 2;
    }
  }

  absl::StatusOr<ServeConfig> config = config_path.empty()
                                           ? ParseServeConfig("", "", overrides)
                                           : LoadServeConfig(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "kvserve serve: bad config: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  if (check) {
    if (absl::Status s = CheckBeforeLoad(*config); !s.ok()) {
      std::fprintf(stderr, "kvserve serve: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    WarnAboutTiers(*config);
    std::printf("config OK: model %s on %s, http %s:%d, grpc %s:%d\n", config->model.path.c_str(),
                config->model.device.c_str(), config->server.host.c_str(), config->server.http_port,
                config->server.host.c_str(), config->server.grpc_port);
    return 0;
  }
  return RunDaemon(*config);
}

}  // namespace kvserve::cli
