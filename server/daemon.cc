#include "server/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/admission/auth.h"
#include "server/admission/client_limiter.h"
#include "server/admission/request_budget.h"
#include "server/engine_builder.h"
#include "server/grpc/grpc_service.h"
#include "server/http/http_service.h"
#include "server/observability/logging.h"
#include "server/observability/metrics.h"
#include "server/serving_state.h"

namespace kvserve {
namespace {

// After the engine drains, how long the front ends get to write the last
// events to their clients.
constexpr absl::Duration kFlushGrace = absl::Seconds(5);

// Signals reach the main loop through a self-pipe written by an
// async-signal-safe handler. sigwait() with a blocked mask is not enough:
// libraries may start threads before main (OpenBLAS did), those threads do not
// block the signals, and a process-directed SIGTERM delivered to one of them
// would kill the daemon instead of draining it.
int g_signal_pipe[2] = {-1, -1};
constexpr int kLoadedEvent = 0;  // not a signal number: the loader thread is done

extern "C" void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

void PostEvent(int event) {
  const unsigned char b = static_cast<unsigned char>(event);
  (void)!write(g_signal_pipe[1], &b, 1);
}

// Blocks until a signal or event arrives.
int WaitEvent() {
  unsigned char b = 0;
  for (;;) {
    const ssize_t n = read(g_signal_pipe[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno != EINTR) std::abort();
  }
}

bool InstallSignalHandlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  // Only SIGTERM and SIGINT drain. The others whose default would end the
  // process at once are caught and logged: the daemon logs to stderr and
  // opens no log file, so SIGHUP has nothing to reopen.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM}) {
    if (sigaction(sig, &sa, nullptr) != 0) return false;
  }
  return true;
}

bool DrainSignal(int sig) { return sig == SIGINT || sig == SIGTERM; }

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGALRM:
      return "SIGALRM";
  }
  return "signal";
}

void LogIgnoredSignal(int sig) {
  spdlog::info(
      "{} ignored (only SIGTERM and SIGINT stop the daemon; logs go to stderr, no log "
      "file to reopen)",
      SignalName(sig));
}

// Every connection is a descriptor: take the hard limit, not the (often
// 1024) soft one, so server.max_connections is what caps them.
void RaiseDescriptorLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    spdlog::warn("cannot raise the open-file limit: {}", std::strerror(errno));
  }
}

}  // namespace

int RunDaemon(const ServeConfig& config) {
  if (absl::Status s = ConfigureLogging(config.logging.level, config.logging.format); !s.ok()) {
    std::fprintf(stderr, "kvserve: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!InstallSignalHandlers()) {
    spdlog::critical("cannot install signal handlers: {}", std::strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  RaiseDescriptorLimit();

  std::vector<std::string> keys;
  if (!config.server.api_key.empty()) keys.push_back(config.server.api_key);
  if (!config.server.api_key_file.empty()) {
    absl::StatusOr<std::vector<std::string>> more =
        ApiKeys::ReadKeyFile(config.server.api_key_file);
    if (!more.ok()) {
      spdlog::critical("{}", std::string(more.status().message()));
      return 1;
    }
    keys.insert(keys.end(), more->begin(), more->end());
  }
  ServerMetrics metrics;
  auto api_keys = std::make_shared<const ApiKeys>(keys);
  ServingState state(&metrics, config.model.chat_template, api_keys);
  // One per-client count over both front ends.
  auto limiter = std::make_shared<ClientLimiter>(config.limits.max_concurrent_per_client);

  HttpService::Options http_options;
  http_options.host = config.server.host;
  http_options.port = config.server.http_port;
  http_options.max_body_bytes = config.server.max_body_bytes;
  http_options.threads = config.server.http_threads;
  http_options.reuse_port = config.server.reuse_port;
  http_options.header_timeout = absl::Seconds(config.server.http_header_timeout_s);
  http_options.body_timeout = absl::Seconds(config.server.http_body_timeout_s);
  http_options.idle_timeout = absl::Seconds(config.server.http_idle_timeout_s);
  http_options.write_timeout = absl::Seconds(config.server.http_write_timeout_s);
  http_options.max_connections = config.server.max_connections;
  http_options.stream_buffer_bytes = config.server.http_stream_buffer_bytes;
  http_options.tls_cert_file = config.server.tls.cert_file;
  http_options.tls_key_file = config.server.tls.key_file;
  http_options.api_keys = api_keys;
  http_options.metrics_auth = config.server.metrics_auth;
  http_options.limits = config.ToRequestLimits();
  http_options.limiter = limiter;
  // One pool of prompt workers (parsing, tokenizing, submitting) for both
  // front ends, sized like the HTTP io threads.
  auto prompt_workers = std::make_shared<PromptWorkers>(std::max(1, config.server.http_threads));
  http_options.prompt_workers = prompt_workers;
  HttpService http(&state, http_options);
  if (absl::Status s = http.Start(); !s.ok()) {
    spdlog::critical("{}", std::string(s.message()));
    return 1;
  }
  GrpcService::Options grpc_options = GrpcService::OptionsFromConfig(config);
  grpc_options.limiter = limiter;
  grpc_options.prompt_workers = prompt_workers;
  GrpcService grpc(&state, std::move(grpc_options));
  if (absl::Status s =
          grpc.Start(config.server.host, config.server.grpc_port, config.server.reuse_port);
      !s.ok()) {
    spdlog::critical("{}", std::string(s.message()));
    http.Stop();
    return 1;
  }
  spdlog::info("listening: http{} {}:{}, grpc {}:{} (not ready: loading {})",
               config.server.tls.cert_file.empty() ? "" : "s", config.server.host, http.port(),
               config.server.host, grpc.port(), config.model.path);

  absl::StatusOr<BuiltEngine> built = absl::UnknownError("not loaded");
  const absl::Time load_start = absl::Now();
  std::thread loader([&] {
    built = BuildEngine(config, [&metrics](const RequestMetrics& m) { metrics.ObserveRequest(m); });
    PostEvent(kLoadedEvent);
  });

  bool loaded = false;
  int sig = 0;
  for (;;) {
    sig = WaitEvent();
    if (DrainSignal(sig)) break;
    if (sig != kLoadedEvent) {
      LogIgnoredSignal(sig);
      continue;
    }
    if (loaded) continue;
    loader.join();
    if (!built.ok()) {
      spdlog::critical("start-up failed: {}", std::string(built.status().message()));
      grpc.Shutdown(absl::Now());
      http.Stop();
      return 1;
    }
    loaded = true;
    metrics.SetMemory(built->info.memory);
    metrics.SetWeightsFingerprint(built->info.weights_fingerprint);
    state.SetReady(built->engine.get(), built->info);
    grpc.SetServing(state.ready());
    spdlog::info(
        "ready in {:.2f}s: serving '{}' (chat template: {}) on http://{}:{} (OpenAI API) and grpc "
        "{}:{}",
        absl::ToDoubleSeconds(absl::Now() - load_start), built->info.name,
        config.model.chat_template.name(), config.server.host, http.port(), config.server.host,
        grpc.port());
  }

  // Shutdown. A second signal means "now".
  state.StartDraining();
  grpc.SetServing(false);
  std::thread([] {
    for (;;) {
      const int again = WaitEvent();
      if (DrainSignal(again)) {
        spdlog::warn("second {}: exiting without waiting", SignalName(again));
        std::_Exit(1);
      }
      if (again != kLoadedEvent) LogIgnoredSignal(again);
    }
  }).detach();
  if (!loaded) {
    // Loading cannot be interrupted; nothing was served, so leave at once.
    spdlog::info("{} while loading: exiting", SignalName(sig));
    grpc.Shutdown(absl::Now());
    http.Stop();
    std::_Exit(0);
  }

  const absl::Time deadline = absl::Now() + absl::Seconds(config.server.shutdown_timeout);
  spdlog::info("{}: draining ({} calls in flight, up to {:.1f}s)", SignalName(sig),
               state.calls_in_flight(), config.server.shutdown_timeout);
  built->engine->Drain(deadline);
  const bool idle = state.WaitForCalls(std::max(deadline, absl::Now()) + kFlushGrace);
  if (!idle) {
    spdlog::warn("{} calls still open after the grace period; closing them",
                 state.calls_in_flight());
  }
  // Both front ends keep answering (HTTP 503, gRPC UNAVAILABLE for new
  // work) until the very end: a late client gets an answer, not a refused
  // connection. StopServing closes the one engine gate of both and returns
  // once no gRPC call or HTTP handler uses the engine (gRPC calls still
  // open after a second are cancelled).
  if (!grpc.StopServing(absl::Now() + absl::Seconds(1))) {
    spdlog::warn("a call still uses the engine after its cancellation; waiting for it");
    state.gate().Close(absl::InfiniteFuture());
  }
  // Open HTTP calls format output with the engine's tokenizer: close them first.
  if (!idle) http.Stop();
  built->engine.reset();
  spdlog::info("stopped");
  grpc.Shutdown(absl::Now());
  http.Stop();
  return 0;
}

}  // namespace kvserve
