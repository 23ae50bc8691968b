// Server reflection over the real daemon, in both versions clients ask for:
// grpc.reflection.v1 (kvserve's own, server/grpc/reflection_v1.cc) and gRPC's
// v1alpha. The two are wire-identical, so one set of messages (the v1 ones
// compiled from proto/) drives both method names.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_context.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

namespace rv1 = grpc::reflection::v1;

// Sends each request on one stream of `method` and returns the answers.
std::vector<rv1::ServerReflectionResponse> Ask(
    const std::string& target, const char* method,
    const std::vector<rv1::ServerReflectionRequest>& reqs) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::internal::RpcMethod rpc(method, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<
      grpc::ClientReaderWriter<rv1::ServerReflectionRequest, rv1::ServerReflectionResponse>>
      stream(grpc::internal::ClientReaderWriterFactory<
             rv1::ServerReflectionRequest, rv1::ServerReflectionResponse>::Create(channel.get(),
                                                                                  rpc, &ctx));
  std::vector<rv1::ServerReflectionResponse> out;
  for (const auto& r : reqs) {
    REQUIRE(stream->Write(r));
    rv1::ServerReflectionResponse resp;
    REQUIRE(stream->Read(&resp));
    out.push_back(resp);
  }
  stream->WritesDone();
  REQUIRE(stream->Finish().ok());
  return out;
}

TEST_CASE("Daemon: server reflection v1 and v1alpha describe the API", "[integration]") {
  testing::DaemonProcess d;
  rv1::ServerReflectionRequest list, symbol, missing;
  list.set_list_services("");
  symbol.set_file_containing_symbol("kvserve.v1.Generation");
  missing.set_file_containing_symbol("no.such.Service");

  for (const char* method : {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                             "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    INFO(method);
    const auto answers = Ask(d.grpc_target(), method, {list, symbol, missing});
    std::vector<std::string> services;
    for (const auto& s : answers[0].list_services_response().service())
      services.push_back(s.name());
    REQUIRE(std::find(services.begin(), services.end(), "kvserve.v1.Generation") != services.end());
    REQUIRE(std::find(services.begin(), services.end(), "grpc.health.v1.Health") != services.end());

    // The file that defines the service, with the service and its methods in it.
    REQUIRE(answers[1].has_file_descriptor_response());
    REQUIRE(answers[1].file_descriptor_response().file_descriptor_proto_size() >= 1);
    google::protobuf::FileDescriptorProto file;
    REQUIRE(file.ParseFromString(answers[1].file_descriptor_response().file_descriptor_proto(0)));
    REQUIRE(file.package() == "kvserve.v1");
    bool found = false;
    for (const auto& svc : file.service()) {
      if (svc.name() != "Generation") continue;
      found = true;
      bool has_generate = false;
      for (const auto& m : svc.method()) has_generate |= m.name() == "Generate";
      REQUIRE(has_generate);
    }
    REQUIRE(found);

    REQUIRE(answers[2].has_error_response());
    REQUIRE(answers[2].error_response().error_code() == grpc::StatusCode::NOT_FOUND);
  }
}

}  // namespace
}  // namespace kvserve
