// GrpcService: the kvserve.v1.Generation service (proto/kvserve.proto) plus
// the standard grpc.health.v1 health service and server reflection.
//
// Built on gRPC's callback API: a Generate stream is a ServerWriteReactor
// that holds no thread while it waits. The engine's RequestStream notify
// (engine thread) and OnWriteDone (gRPC thread) both "pump" the reactor:
// with no write in flight, the next ready output is written, and the end of
// the stream finishes the call. Nothing in a reaction blocks.
//
// Health: NOT_SERVING while the model loads and while draining, SERVING when
// ready; SetServing() flips both the overall ("") and the Generation status.
//
// Thread-safety: Start/Shutdown from one thread; calls run on gRPC's threads.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/serving_state.h"

namespace grpc {
class Server;
}

namespace kvserve {

class ReflectionV1Service;


class GrpcService {
 public:
  explicit GrpcService(ServingState* state);
  ~GrpcService();
  GrpcService(const GrpcService&) = delete;
  GrpcService& operator=(const GrpcService&) = delete;

  // Listens on host:port (0: any free port), insecure credentials.
  // reuse_port: SO_REUSEPORT (gRPC's default is on; kvserve turns it off so a
  // port in use fails start-up).
  absl::Status Start(const std::string& host, int port, bool reuse_port = false);
  int port() const { return port_; }
  // Health status of every service.
  void SetServing(bool serving);
  // Stops accepting calls; calls still open at `deadline` are cancelled.
  void Shutdown(absl::Time deadline);

 private:
  class Impl;
  ServingState* const state_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace kvserve
