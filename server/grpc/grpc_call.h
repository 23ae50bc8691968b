// What the gRPC methods of GrpcService share inside server/grpc/: errors
// and messages between absl / protobuf and gRPC's raw byte buffers,
// admission, and CallEnv, the daemon's state every call reaches; and the
// Generate call (generate_call.cc: parsing, the prompt worker, the engine's
// stream pumped to the client).
//
// Thread-safety: the functions are pure or read the state's thread-safe
// parts; a CallEnv is read by every call and written once, by GrpcService.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/admission/auth.h"
#include "server/admission/client_limiter.h"
#include "server/admission/engine_gate.h"
#include "server/admission/request_budget.h"
#include "server/grpc/grpc_service.h"
#include "server/observability/logging.h"
#include "server/serving_state.h"
#include "util/field_status.h"

namespace kvserve::grpc_call {

// The trailing metadata key that names the request field an
// INVALID_ARGUMENT is about (what HTTP puts in the error's "param").
inline constexpr char kFieldTrailer[] = "kvserve-field";

// ctx (when given) gets the kvserve-field trailer of a FieldError.
grpc::Status ToGrpc(const absl::Status& s, grpc::CallbackServerContext* ctx = nullptr);
std::string_view Metadata(const grpc::CallbackServerContext& ctx, const char* key);
// Refuses calls the daemon cannot take: no model yet, draining, wrong key.
grpc::Status Admit(const ServingState& state, const grpc::CallbackServerContext& ctx,
                   bool needs_ready);
// The request field a protobuf full field name is ("kvserve.v1.KvPolicy.policy"
// -> "kv_policy.policy", "kvserve.v1.GenerateRequest.prompt" -> "prompt").
std::string RequestFieldName(std::string_view full_name);

// Parses a raw request. A malformed one is an InvalidArgument saying why,
// naming the field for invalid UTF-8 (libprotobuf's complaint is captured,
// not printed).
template <typename Message>
absl::Status ParseRequest(const grpc::ByteBuffer& raw, Message* msg) {
  // A call whose HEADERS end the stream carries no message at all (an empty
  // message is a valid, zero-length buffer): not a default request.
  if (!raw.Valid()) {
    return absl::InvalidArgumentError(absl::StrCat("no ", Message::descriptor()->name(),
                                                   " message: the call ended before sending one"));
  }
  grpc::ByteBuffer copy(raw);  // the reader needs a mutable buffer; slices are shared
  grpc::ProtoBufferReader reader(&copy);
  ProtobufLogCapture capture;
  if (msg->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  const std::string type = Message::descriptor()->name();
  const std::string& why = capture.text();
  if (absl::StrContains(why, "invalid UTF-8")) {
    // "String field 'kvserve.v1.GenerateRequest.prompt' contains invalid UTF-8 ..."
    const size_t open = why.find('\'');
    const size_t close = open == std::string::npos ? open : why.find('\'', open + 1);
    if (close != std::string::npos) {
      const std::string full = why.substr(open + 1, close - open - 1);
      const std::string field = RequestFieldName(full);
      return FieldError(
          field, absl::StrCat(type, ".", field, " is not valid UTF-8 (string fields must be)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the ", type, " message has a string field that is not valid UTF-8"));
  }
  return absl::InvalidArgumentError(absl::StrCat("the ", type, " message cannot be parsed (",
                                                 raw.Length(),
                                                 " bytes, truncated or not a protobuf message)"));
}

template <typename Message>
grpc::Status Serialize(const Message& msg, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  out->Clear();  // the writer fills an empty buffer only
  return grpc::SerializationTraits<Message>::Serialize(msg, out, &own_buffer);
}

// What every call shares: the daemon's state, the budget, the per-client
// limiter, the prompt workers and the engine gate.
struct CallEnv {
  ServingState* state = nullptr;
  const GrpcService::Options* options = nullptr;
  ClientLimiter* limiter = nullptr;
  PromptClient* workers = nullptr;
  EngineGate* gate = nullptr;

  // Admit, holding a lease on the engine when admitted.
  grpc::Status Admit(const grpc::CallbackServerContext& ctx, bool needs_ready,
                     EngineGate::Lease* lease) const {
    *lease = gate->Enter();
    if (!lease->held()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
    }
    grpc::Status st = grpc_call::Admit(*state, ctx, needs_ready);
    if (!st.ok()) lease->Release();
    return st;
  }

  // The budget for the served model (valid once an engine is published).
  RequestLimits Limits() const {
    RequestLimits l = ResolveRequestLimits(options->limits, state->info().max_model_len);
    l.vocab_size = state->engine()->tokenizer().vocab_size();
    return l;
  }
  // With keys, the key the call presented (Admit checked it); else "".
  std::string_view ApiKeyOf(const grpc::CallbackServerContext& ctx) const {
    if (state->api_keys()->empty()) return {};
    return BearerToken(Metadata(ctx, "authorization")).value_or(std::string_view());
  }
  std::string ClientOf(const grpc::CallbackServerContext& ctx) const {
    return ClientKey(ApiKeyOf(ctx), ctx.peer());
  }
};

// A Generate call on `request` (generate_call.cc); it deletes itself when
// gRPC is done with it.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartGenerate(const CallEnv& env,
                                                          grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* request);

}  // namespace kvserve::grpc_call
