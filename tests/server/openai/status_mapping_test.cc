// ApiErrorFromStatus over every absl status code: the HTTP status, the
// OpenAI error type, the code and the param each maps to, in one table, so a
// code whose mapping changes (or one a new engine path starts returning,
// such as OutOfRange) fails here; and the error body as clients read it.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "server/admission/client_limiter.h"
#include "server/openai/openai_protocol.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

struct Mapping {
  absl::StatusCode code;
  int http_status;
  const char* type;
};

// Every code but kOk, in absl's numbering.
constexpr Mapping kMappings[] = {
    {absl::StatusCode::kCancelled, 500, "server_error"},
    {absl::StatusCode::kUnknown, 500, "server_error"},
    {absl::StatusCode::kInvalidArgument, 400, "invalid_request_error"},
    {absl::StatusCode::kDeadlineExceeded, 500, "server_error"},
    {absl::StatusCode::kNotFound, 500, "server_error"},
    {absl::StatusCode::kAlreadyExists, 500, "server_error"},
    {absl::StatusCode::kPermissionDenied, 500, "server_error"},
    {absl::StatusCode::kResourceExhausted, 429, "rate_limit_exceeded"},
    {absl::StatusCode::kFailedPrecondition, 500, "server_error"},
    {absl::StatusCode::kAborted, 500, "server_error"},
    {absl::StatusCode::kOutOfRange, 400, "invalid_request_error"},
    {absl::StatusCode::kUnimplemented, 500, "server_error"},
    {absl::StatusCode::kInternal, 500, "server_error"},
    {absl::StatusCode::kUnavailable, 503, "service_unavailable"},
    {absl::StatusCode::kDataLoss, 500, "server_error"},
    {absl::StatusCode::kUnauthenticated, 500, "server_error"},
};

TEST_CASE("Every status code maps to its documented HTTP status and error type",
          "[server][openai]") {
  REQUIRE(std::size(kMappings) == 16);  // absl's codes 1..16
  for (const Mapping& m : kMappings) {
    INFO(absl::StatusCodeToString(m.code));
    const ApiError e = ApiErrorFromStatus(absl::Status(m.code, "what went wrong"), "prompt");
    REQUIRE(e.http_status == m.http_status);
    REQUIRE(e.type == m.type);
    REQUIRE(e.message == "what went wrong");
    if (m.code == absl::StatusCode::kResourceExhausted) {
      REQUIRE(e.code == "queue_full");
    } else {
      REQUIRE(e.code.empty());
    }
    REQUIRE(e.param.empty());  // no field in the status
  }
}

TEST_CASE("A field named by the status becomes param, a prompt field this API's prompt",
          "[server][openai]") {
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange}) {
    INFO(absl::StatusCodeToString(code));
    auto with_field = [code](const char* field) {
      absl::Status s(code, "bad");
      s.SetPayload(kFieldPayloadUrl, absl::Cord(field));
      return s;
    };
    REQUIRE(ApiErrorFromStatus(with_field("top_p"), "messages").param == "top_p");
    REQUIRE(ApiErrorFromStatus(with_field("prompt"), "messages").param == "messages");
    REQUIRE(ApiErrorFromStatus(with_field("prompt_token_ids"), "prompt").param == "prompt");
    REQUIRE(ApiErrorFromStatus(with_field("max_tokens"), "prompt").http_status == 400);
  }
}

TEST_CASE("A client over its concurrency limit is told apart from a full queue",
          "[server][openai]") {
  ClientLimiter limiter(1);
  absl::StatusOr<ClientLimiter::Token> first = limiter.Acquire("key:a");
  REQUIRE(first.ok());
  absl::StatusOr<ClientLimiter::Token> second = limiter.Acquire("key:a");
  REQUIRE(second.status().code() == absl::StatusCode::kResourceExhausted);
  const ApiError e = ApiErrorFromStatus(second.status(), "prompt");
  REQUIRE(e.http_status == 429);
  REQUIRE(e.type == "rate_limit_exceeded");
  REQUIRE(e.code == "concurrency_limit_exceeded");
  REQUIRE(e.message.find("limits.max_concurrent_per_client") != std::string::npos);
}

TEST_CASE("The error body is OpenAI's shape with null for an empty param and code",
          "[server][openai]") {
  const json unavailable =
      ApiErrorFromStatus(absl::UnavailableError("draining"), "prompt").ToJson();
  REQUIRE(unavailable == json{{"error",
                               {{"message", "draining"},
                                {"type", "service_unavailable"},
                                {"param", nullptr},
                                {"code", nullptr}}}});
  const json full = ApiErrorFromStatus(absl::ResourceExhaustedError("full"), "prompt").ToJson();
  REQUIRE(full["error"]["code"] == "queue_full");
  REQUIRE(json::parse(ApiErrorFromStatus(absl::InternalError("x"), "prompt").Body()) ==
          ApiErrorFromStatus(absl::InternalError("x"), "prompt").ToJson());
}

}  // namespace
}  // namespace kvserve
