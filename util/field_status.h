// Errors that name the request field they are about, carried as data: the
// field rides in the absl::Status as a payload, so the HTTP front end fills
// OpenAI's error "param" and the gRPC front end its "kvserve-field" trailer
// from the same place, whatever the message says.
//
//   return FieldError("top_p", "top_p must be in (0, 1], got 2");
//   ErrorField(status);  // "top_p"; "" for a status without a field
//
// Thread-safety: free functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace kvserve {

inline constexpr char kFieldPayloadUrl[] = "type.kvserve.dev/field";

// InvalidArgument with `message`, naming `field` (a request parameter such
// as "temperature", "stop" or "prompt").
inline absl::Status FieldError(std::string_view field, std::string_view message) {
  absl::Status s = absl::InvalidArgumentError(absl::string_view(message.data(), message.size()));
  s.SetPayload(kFieldPayloadUrl, absl::Cord(absl::string_view(field.data(), field.size())));
  return s;
}

// The field a status names, or "".
inline std::string ErrorField(const absl::Status& status) {
  auto field = status.GetPayload(kFieldPayloadUrl);  // absl::optional in Debian's Abseil
  return field ? std::string(*field) : std::string();
}

}  // namespace kvserve
