#include "server/logging.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace kvserve
