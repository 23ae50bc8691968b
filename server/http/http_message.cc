#include "server/http/http_message.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvserve {

namespace beast = boost::beast;
namespace http = beast::http;

namespace http_internal {

// (Debian's Abseil has its own string_view: compare std ones here.)
bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && beast::iequals(beast::string_view(a.data(), a.size()),
                                                beast::string_view(b.data(), b.size()));
}

HttpResponse ErrorResponse(int status, std::string message, std::string code, std::string type) {
  nlohmann::json e = {{"message", std::move(message)},
                      {"type", std::move(type)},
                      {"param", nullptr},
                      {"code", nullptr}};
  if (!code.empty()) e["code"] = std::move(code);
  HttpResponse r;
  r.status = status;
  r.body = nlohmann::json{{"error", std::move(e)}}.dump(-1, ' ', false,
                                                        nlohmann::json::error_handler_t::replace);
  return r;
}

std::string Head(const HttpResponse& r, bool keep_alive, int request_version,
                 std::optional<size_t> content_length, bool chunked) {
  std::string h =
      absl::StrCat("HTTP/1.1 ", r.status, " ", std::string(HttpReason(r.status)), "\r\n");
  if (!r.content_type.empty()) absl::StrAppend(&h, "Content-Type: ", r.content_type, "\r\n");
  for (const auto& [name, value] : r.headers) absl::StrAppend(&h, name, ": ", value, "\r\n");
  if (content_length) absl::StrAppend(&h, "Content-Length: ", *content_length, "\r\n");
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive) {
    h += "Connection: close\r\n";
  } else if (request_version == 10) {
    h += "Connection: keep-alive\r\n";
  }
  h += "\r\n";
  return h;
}

std::optional<HttpResponse> CheckTransferEncoding(
    const http::request_parser<http::string_body>& p) {
  const auto& fields = p.get();
  if (fields.count(http::field::transfer_encoding) == 0) return std::nullopt;
  std::vector<std::string> codings;
  std::string all;
  for (auto it = fields.find(http::field::transfer_encoding);
       it != fields.end() && it->name() == http::field::transfer_encoding; ++it) {
    const std::string value(it->value());
    absl::StrAppend(&all, all.empty() ? "" : ", ", value);
    for (absl::string_view c : absl::StrSplit(value, ',')) {
      codings.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(c)));
    }
  }
  if (fields.count(http::field::content_length) > 0) {
    return ErrorResponse(400,
                         absl::StrCat("ambiguous framing: the request has both Content-Length and "
                                      "Transfer-Encoding ('",
                                      all, "')"),
                         "ambiguous_framing");
  }
  for (const std::string& c : codings) {
    if (c != "chunked") {
      return ErrorResponse(501,
                           absl::StrCat("Transfer-Encoding '", all,
                                        "' is not supported: the only transfer coding "
                                        "accepted is chunked"),
                           "unsupported_transfer_encoding");
    }
  }
  if (codings.size() != 1) {
    return ErrorResponse(
        400, absl::StrCat("Transfer-Encoding '", all, "' applies chunked more than once"),
        "bad_transfer_encoding");
  }
  return std::nullopt;
}

}  // namespace http_internal

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (http_internal::IEquals(n, name)) return v;
  }
  return {};
}

std::string_view HttpReason(int status) {
  beast::string_view r = http::obsolete_reason(static_cast<http::status>(status));
  return std::string_view(r.data(), r.size());
}

}  // namespace kvserve
