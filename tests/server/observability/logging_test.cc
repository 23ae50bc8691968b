#include "server/observability/logging.h"

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

#include "proto/kvserve.pb.h"

namespace kvserve {
namespace {

TEST_CASE("JSON log lines are one object with the request id lifted out", "[server]") {
  using json = nlohmann::json;
  json j = json::parse(FormatJsonLogLine("info", "2026-01-02T03:04:05.678Z",
                                         "[cmpl-7] stream \"done\"\n after 0.1s"));
  REQUIRE(j == json{{"ts", "2026-01-02T03:04:05.678Z"},
                    {"level", "info"},
                    {"request_id", "cmpl-7"},
                    {"msg", "stream \"done\"\n after 0.1s"}});
  j = json::parse(FormatJsonLogLine("warn", "t", "no id here"));
  REQUIRE_FALSE(j.contains("request_id"));
  REQUIRE(j["msg"] == "no id here");
  // Invalid UTF-8 never breaks the line.
  REQUIRE(json::parse(FormatJsonLogLine("info", "t", "bad \xff byte"))["msg"] ==
          "bad \xEF\xBF\xBD byte");
}

TEST_CASE("Logging configuration refuses unknown levels and formats", "[server]") {
  REQUIRE(ConfigureLogging("info", "text").ok());
  REQUIRE(ConfigureLogging("debug", "json").ok());
  REQUIRE(ConfigureLogging("loud", "text").message() == "logging.level: unknown level 'loud'");
  REQUIRE(ConfigureLogging("info", "xml").message() ==
          "logging.format: expected text or json, got 'xml'");
  REQUIRE(ConfigureLogging("warn", "text").ok());
}

TEST_CASE("libprotobuf's lines go through spdlog, or to a capture while one is open", "[server]") {
  std::ostringstream lines;
  auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(lines));
  logger->set_pattern("%l %v");
  spdlog::set_default_logger(logger);
  RouteProtobufLogs();
  // GenerateRequest.prompt holding 0xff: protobuf refuses it and says why.
  const std::string bad("\x12\x01\xff", 3);
  v1::GenerateRequest r;
  {
    ProtobufLogCapture capture;
    REQUIRE_FALSE(r.ParseFromString(bad));
    REQUIRE(capture.text().find("String field 'kvserve.v1.GenerateRequest.prompt' contains "
                                "invalid UTF-8 data") != std::string::npos);
  }
  REQUIRE(lines.str().empty());
  REQUIRE_FALSE(r.ParseFromString(bad));
  spdlog::set_default_logger(previous);
  INFO(lines.str());
  REQUIRE(lines.str().starts_with("warning protobuf ("));
  REQUIRE(lines.str().find("String field 'kvserve.v1.GenerateRequest.prompt' contains invalid "
                           "UTF-8 data") != std::string::npos);
}

TEST_CASE("Text log lines escape control characters and cap what a client sent", "[server]") {
  SECTION("escaping") {
    REQUIRE(EscapeLogMessage("plain text") == "plain text");
    REQUIRE(EscapeLogMessage("a\nb\rc\td") == "a\\nb\\rc\\td");
    REQUIRE(EscapeLogMessage(std::string("\x1b[31m\x00\x7f", 7)) == "\\x1b[31m\\x00\\x7f");
    REQUIRE(EscapeLogMessage("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 is no control
  }
  SECTION("a line over kMaxLogLineBytes is cut, its length noted") {
    REQUIRE(EscapeLogMessage(std::string(5000, 'x')) ==
            std::string(kMaxLogLineBytes, 'x') + "... (5000 bytes)");
  }
  SECTION("LogText: kLogTextBytes of a client string and its length") {
    REQUIRE(LogText("short") == "short");
    REQUIRE(LogText(std::string(8 << 20, 'f')) == std::string(256, 'f') + "... (8388608 bytes)");
  }
  SECTION("the text formatter writes one line whatever the message holds") {
    std::ostringstream lines;
    auto previous = spdlog::default_logger();
    auto logger = std::make_shared<spdlog::logger>(
        "text", std::make_shared<spdlog::sinks::ostream_sink_mt>(lines));
    logger->set_formatter(MakeTextLogFormatter());
    spdlog::set_default_logger(logger);
    spdlog::info("model '{}' not found", "x\n2030-01-01T00:00:00.000 E forged");
    spdlog::info("next");
    spdlog::set_default_logger(previous);
    const std::string out = lines.str();
    INFO(out);
    REQUIRE(std::count(out.begin(), out.end(), '\n') == 2);
    const size_t first_end = out.find('\n');
    REQUIRE(out.substr(0, first_end)
                .ends_with(" I model 'x\\n2030-01-01T00:00:00.000 E forged' not found"));
    REQUIRE(out.substr(first_end + 1).ends_with(" I next\n"));
  }
}

}  // namespace
}  // namespace kvserve
