#include "server/logging.h"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

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

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto level = spdlog::level::to_string_view(msg.level);
    std::string line =
        FormatJsonLogLine(std::string_view(level.data(), level.size()), Timestamp(msg.time),
                          std::string_view(msg.payload.data(), msg.payload.size()));
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
  spdlog::log(lvl, "protobuf ({}:{}): {}", filename, line, message);
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

absl::Status ConfigureLogging(const std::string& level, const std::string& format) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("logging.level: unknown level '", level, "'"));
  }
  spdlog::drop("kvserve");
  auto logger = spdlog::stderr_color_mt("kvserve");
  logger->set_level(lvl);
  if (format == "json") {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else if (format == "text") {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
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
