#include "server/daemon.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine_builder.h"
#include "server/grpc_service.h"
#include "server/http_service.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/serving_state.h"

namespace kvserve {
namespace {

// After the engine drains, how long the front ends get to write the last
// events to their clients.
constexpr absl::Duration kFlushGrace = absl::Seconds(5);

sigset_t DaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);  // the loader thread is done
  return set;
}

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace

int RunDaemon(const ServeConfig& config) {
  if (absl::Status s = ConfigureLogging(config.logging.level, config.logging.format); !s.ok()) {
    std::fprintf(stderr, "kvserve: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // Before any thread exists, so that every thread inherits the mask.
  const sigset_t signals = DaemonSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ServerMetrics metrics;
  ServingState state(&metrics, config.model.chat_template, config.server.api_key);

  HttpService::Options http_options;
  http_options.host = config.server.host;
  http_options.port = config.server.http_port;
  http_options.max_body_bytes = config.server.max_body_bytes;
  http_options.threads = config.server.http_threads;
  HttpService http(&state, http_options);
  if (absl::Status s = http.Start(); !s.ok()) {
    spdlog::critical("{}", std::string(s.message()));
    return 1;
  }
  GrpcService grpc(&state);
  if (absl::Status s = grpc.Start(config.server.host, config.server.grpc_port); !s.ok()) {
    spdlog::critical("{}", std::string(s.message()));
    http.Stop();
    return 1;
  }
  spdlog::info("listening: http {}:{}, grpc {}:{} (not ready: loading {})", config.server.host,
               http.port(), config.server.host, grpc.port(), config.model.path);

  absl::StatusOr<BuiltEngine> built = absl::UnknownError("not loaded");
  const absl::Time load_start = absl::Now();
  std::thread loader([&] {
    built = BuildEngine(config, [&metrics](const RequestMetrics& m) { metrics.ObserveRequest(m); });
    kill(getpid(), SIGUSR1);
  });

  bool loaded = false;
  int sig = 0;
  for (;;) {
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig != SIGUSR1) break;
    if (loaded) continue;
    loader.join();
    if (!built.ok()) {
      spdlog::critical("start-up failed: {}", std::string(built.status().message()));
      grpc.Shutdown(absl::Now());
      http.Stop();
      return 1;
    }
    loaded = true;
    state.SetReady(built->engine.get(), built->info);
    grpc.SetServing(state.ready());
    spdlog::info("ready in {:.2f}s: serving '{}' on http://{}:{} (OpenAI API) and grpc {}:{}",
                 absl::ToDoubleSeconds(absl::Now() - load_start), built->info.name,
                 config.server.host, http.port(), config.server.host, grpc.port());
  }

  // Shutdown. A second signal means "now".
  state.StartDraining();
  grpc.SetServing(false);
  std::thread([signals] {
    int again = 0;
    while (sigwait(&signals, &again) == 0) {
      if (again == SIGINT || again == SIGTERM) {
        spdlog::warn("second {}: exiting without waiting", SignalName(again));
        std::_Exit(1);
      }
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
  if (!state.WaitForCalls(std::max(deadline, absl::Now()) + kFlushGrace)) {
    spdlog::warn("{} calls still open after the grace period; closing them",
                 state.calls_in_flight());
  }
  grpc.Shutdown(absl::Now() + absl::Seconds(1));
  http.Stop();
  built->engine.reset();
  spdlog::info("stopped");
  return 0;
}

}  // namespace kvserve
