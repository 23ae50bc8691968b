// ReflectionV1Service: gRPC server reflection, version v1
// (grpc.reflection.v1.ServerReflection), beside the v1alpha service that
// Debian's gRPC provides. Current clients (grpcurl, Postman, grpcui) try v1
// first. Descriptors come from protobuf's generated pool, so every service
// compiled into kvserve can be described; list_services answers the names
// given at construction (what the server registered).
//
// Requests: list_services, file_by_filename, file_containing_symbol (a
// service, method, message, enum or field name) and file_containing_extension
// / all_extension_numbers_of_type (proto3 has no extensions: NOT_FOUND unless
// the type has some). A file answer carries the file and its transitive
// dependencies, each once per stream, as serialized FileDescriptorProtos.
//
// Thread-safety: the service is stateless across streams; one reactor per
// stream.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace kvserve {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  explicit ReflectionV1Service(std::vector<std::string> service_names)
      : service_names_(std::move(service_names)) {}

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // One request's answer (what the stream sends back); `sent` names the
  // files this stream already sent, so dependencies go out once.
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request,
      std::vector<std::string>* sent) const;

 private:
  std::vector<std::string> service_names_;
};

}  // namespace kvserve
