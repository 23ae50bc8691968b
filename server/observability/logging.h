// Daemon logging: spdlog's default logger on stderr, as human-readable text
// lines or as JSON lines (one object per line: ts, level, msg, and
// request_id when the message starts with "[<request id>] ").
//
// Request-scoped lines go through LogRequest so every one carries its id.
//
// A client cannot forge or flood lines: the text format escapes control
// characters (a "\n" in a model name is logged as the two characters \n,
// not as a new line; JSON escapes them by itself), a client string is logged
// through LogText (at most kLogTextBytes of it, with its length), any line is
// cut at kMaxLogLineBytes whatever went into it, and a line repeating the
// previous one within kRepeatWindow is dropped, counted in a "Skipped N
// duplicate messages.." line before the next different one.
// libprotobuf's own log lines (e.g. "String field ... contains invalid UTF-8
// data") go through the same logger (RouteProtobufLogs, which
// ConfigureLogging calls), and a front end that parses a message can collect
// them instead with ProtobufLogCapture, to answer the client with the reason.
//
// Thread-safety: ConfigureLogging once at start-up; logging from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvserve {

inline constexpr size_t kLogTextBytes = 256;
inline constexpr size_t kMaxLogLineBytes = 4096;
inline constexpr std::chrono::milliseconds kRepeatWindow{1000};

// level: trace|debug|info|warn|error|critical|off; format: text|json.
absl::Status ConfigureLogging(const std::string& level, const std::string& format);

// A client string for a log line: at most kLogTextBytes, then "... (N bytes)".
std::string LogText(std::string_view s);

// The text format's message: control characters (and DEL) as \n, \r, \t or
// \xNN, then cut to kMaxLogLineBytes with the original length noted.
std::string EscapeLogMessage(std::string_view message);

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

// The text format's formatter (timestamp, level letter, escaped message),
// exposed for tests.
std::unique_ptr<spdlog::formatter> MakeTextLogFormatter();

// The formatter behind the JSON format, exposed for tests: renders one
// record as a JSON object line.
std::string FormatJsonLogLine(std::string_view level, std::string_view timestamp,
                              std::string_view message);

}  // namespace kvserve
