#include "server/observability/logging.h"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/formatter.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/dup_filter_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "server/openai/json_body.h"

namespace kvserve {
namespace {

std::string Timestamp(std::chrono::system_clock::time_point tp) {
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(tp);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(tp - secs).count());
  std::time_t t = std::chrono::system_clock::to_time_t(tp);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

std::string_view Payload(const spdlog::details::log_msg& msg) {
  return std::string_view(msg.payload.data(), msg.payload.size());
}

bool NeedsEscape(std::string_view s) {
  if (s.size() > kMaxLogLineBytes) return true;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

// The text pattern, run on the escaped message.
class EscapingFormatter final : public spdlog::formatter {
 public:
  EscapingFormatter() : inner_(std::make_unique<spdlog::pattern_formatter>(kPattern)) {}
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    if (!NeedsEscape(Payload(msg))) return inner_->format(msg, dest);
    const std::string escaped = EscapeLogMessage(Payload(msg));
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(escaped.data(), escaped.size());
    inner_->format(copy, dest);
    // The colour sink reads the level's range from the message it passed.
    msg.color_range_start = copy.color_range_start;
    msg.color_range_end = copy.color_range_end;
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<EscapingFormatter>();
  }

 private:
  static constexpr char kPattern[] = "%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v";
  std::unique_ptr<spdlog::formatter> inner_;
};

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto level = spdlog::level::to_string_view(msg.level);
    std::string_view payload = Payload(msg);
    std::string capped;
    if (payload.size() > kMaxLogLineBytes) {
      capped = CapClientText(payload, kMaxLogLineBytes);
      payload = capped;
    }
    std::string line = FormatJsonLogLine(std::string_view(level.data(), level.size()),
                                         Timestamp(msg.time), payload);
    line.push_back('\n');
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

thread_local std::string* protobuf_capture = nullptr;

void OnProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                   const std::string& message) {
  if (protobuf_capture != nullptr) {
    if (!protobuf_capture->empty()) protobuf_capture->append("; ");
    protobuf_capture->append(message);
    return;
  }
  spdlog::level::level_enum lvl = spdlog::level::info;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      lvl = spdlog::level::debug;
      break;
    case google::protobuf::LOGLEVEL_WARNING:
      lvl = spdlog::level::warn;
      break;
    case google::protobuf::LOGLEVEL_ERROR:
      lvl = spdlog::level::warn;  // about one message from a client, not the server
      break;
    case google::protobuf::LOGLEVEL_FATAL:
      lvl = spdlog::level::critical;
      break;
  }
  spdlog::log(lvl, "protobuf ({}:{}): {}", filename, line, LogText(message));
}

}  // namespace

void RouteProtobufLogs() { google::protobuf::SetLogHandler(&OnProtobufLog); }

ProtobufLogCapture::ProtobufLogCapture() { protobuf_capture = &text_; }
ProtobufLogCapture::~ProtobufLogCapture() { protobuf_capture = nullptr; }

std::string FormatJsonLogLine(std::string_view level, std::string_view timestamp,
                              std::string_view message) {
  nlohmann::json j;
  j["ts"] = std::string(timestamp);
  j["level"] = std::string(level);
  if (message.size() > 2 && message[0] == '[') {
    size_t close = message.find("] ");
    if (close != std::string_view::npos) {
      j["request_id"] = std::string(message.substr(1, close - 1));
      message.remove_prefix(close + 2);
    }
  }
  j["msg"] = std::string(message);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::unique_ptr<spdlog::formatter> MakeTextLogFormatter() {
  return std::make_unique<EscapingFormatter>();
}

std::string LogText(std::string_view s) { return CapClientText(s, kLogTextBytes); }

std::string EscapeLogMessage(std::string_view message) {
  std::string out;
  const std::string_view kept = message.substr(0, kMaxLogLineBytes);
  out.reserve(kept.size());
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : kept) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    } else {
      out.push_back(c);
    }
  }
  if (kept.size() < message.size()) absl::StrAppend(&out, "... (", message.size(), " bytes)");
  return out;
}

absl::Status ConfigureLogging(const std::string& level, const std::string& format) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("logging.level: unknown level '", level, "'"));
  }
  spdlog::drop("kvserve");
  auto dedup = std::make_shared<spdlog::sinks::dup_filter_sink_mt>(kRepeatWindow);
  dedup->add_sink(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  auto logger = std::make_shared<spdlog::logger>("kvserve", dedup);
  logger->set_level(lvl);
  if (format == "json") {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else if (format == "text") {
    logger->set_formatter(MakeTextLogFormatter());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("logging.format: expected text or json, got '", format, "'"));
  }
  // Warnings and worse reach the terminal at once even if the process dies.
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  RouteProtobufLogs();
  return absl::OkStatus();
}

}  // namespace kvserve
