// grpc.health.v1.Health/Check for tests, hand-encoded because Debian ships no
// generated health stubs: the request is field 1 (service name), the reply
// field 1 (status enum). Header-only; used by server and integration tests.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include <memory>
#include <string>
#include <vector>

namespace kvserve::testing {

// 1 SERVING, 2 NOT_SERVING, -1 on error.
inline int GrpcHealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& service) {
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0a);
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(),
      grpc::internal::RpcMethod("/grpc.health.v1.Health/Check",
                                grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
  if (!st.ok()) return -1;
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

}  // namespace kvserve::testing
