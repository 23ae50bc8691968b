// RunDaemon: the `kvserve serve` process from start to exit.
//
//   1. Configure logging; take SIGINT/SIGTERM through a self-pipe, ignore
//      SIGPIPE (a vanished client is a failed write, not a crash), raise the
//      open-file limit to its hard limit (connections are descriptors), read
//      the API keys (server.api_key, server.api_key_file).
//   2. Listen on HTTP and gRPC at once, not ready (503 / NOT_SERVING).
//   3. Load the model and start the engine on a helper thread; then ready.
//   4. On SIGTERM or SIGINT: stop admitting (503 / UNAVAILABLE, health
//      NOT_SERVING), let in-flight requests finish until
//      server.shutdown_timeout (then cancel them), let the front ends flush
//      the last events, stop gRPC and the engine, and return 0. The HTTP
//      listener stays open to the end, answering 503 with a JSON body, so a
//      late client is answered rather than refused. A second signal exits at
//      once with 1.
//
// Returns the process exit code: 0 after a clean shutdown, 1 when listening
// or loading failed.
#pragma once

#include "server/config/config.h"

namespace kvserve {

int RunDaemon(const ServeConfig& config);

}  // namespace kvserve
