// Daemon logging: spdlog's default logger on stderr, as human-readable text
// lines or as JSON lines (one object per line: ts, level, msg, and
// request_id when the message starts with "[<request id>] ").
//
// Request-scoped lines go through LogRequest so every one carries its id.
// libprotobuf's own log lines (e.g. "String field ... contains invalid UTF-8
// data") go through the same logger (RouteProtobufLogs, which
// ConfigureLogging calls), and a front end that parses a message can collect
// them instead with ProtobufLogCapture, to answer the client with the reason.
//
// Thread-safety: ConfigureLogging once at start-up; logging from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvserve {

// level: trace|debug|info|warn|error|critical|off; format: text|json.
absl::Status ConfigureLogging(const std::string& level, const std::string& format);

// "[<request_id>] <message>"; the JSON format lifts the id into its own field.
template <typename... Args>
void LogRequest(spdlog::level::level_enum level, std::string_view request_id,
                spdlog::format_string_t<Args...> fmt, Args&&... args) {
  if (!spdlog::should_log(level)) return;
  spdlog::log(level, "[{}] {}", request_id, fmt::format(fmt, std::forward<Args>(args)...));
}

// Sends libprotobuf's log lines to spdlog (idempotent).
void RouteProtobufLogs();

// While alive, libprotobuf's log lines on this thread are collected here
// instead of logged. Not nestable.
class ProtobufLogCapture {
 public:
  ProtobufLogCapture();
  ~ProtobufLogCapture();
  ProtobufLogCapture(const ProtobufLogCapture&) = delete;
  ProtobufLogCapture& operator=(const ProtobufLogCapture&) = delete;
  // The collected lines, joined with "; ".
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The formatter behind the JSON format, exposed for tests: renders one
// record as a JSON object line.
std::string FormatJsonLogLine(std::string_view level, std::string_view timestamp,
                              std::string_view message);

}  // namespace kvserve
