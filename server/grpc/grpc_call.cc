#include "server/grpc/grpc_call.h"

namespace kvserve::grpc_call {

// ctx (when given) gets the kvserve-field trailer of a FieldError.
grpc::Status ToGrpc(const absl::Status& s, grpc::CallbackServerContext* ctx) {
  if (const std::string field = ErrorField(s); ctx != nullptr && !field.empty()) {
    ctx->AddTrailingMetadata(kFieldTrailer, field);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string_view Metadata(const grpc::CallbackServerContext& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string_view()
                        : std::string_view(it->second.data(), it->second.size());
}

// Refuses calls the daemon cannot take: no model yet, draining, wrong key.
grpc::Status Admit(const ServingState& state, const grpc::CallbackServerContext& ctx,
                   bool needs_ready) {
  if (!state.Authorized(Metadata(ctx, "authorization"))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong 'authorization: Bearer <key>' metadata");
  }
  if (state.engine() == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading");
  }
  if (needs_ready && !state.ready()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  }
  return grpc::Status::OK;
}

// The request field a protobuf full field name is ("kvserve.v1.KvPolicy.policy"
// -> "kv_policy.policy", "kvserve.v1.GenerateRequest.prompt" -> "prompt").
std::string RequestFieldName(std::string_view full_name) {
  const size_t dot = full_name.rfind('.');
  if (dot == std::string_view::npos) return std::string(full_name);
  std::string field(full_name.substr(dot + 1));
  if (absl::EndsWith(absl::string_view(full_name.data(), dot), "KvPolicy")) {
    return "kv_policy." + field;
  }
  return field;
}

}  // namespace kvserve::grpc_call
