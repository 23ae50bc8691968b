// The HTTP/1.1 message pieces the transport writes and checks, apart from
// the connection that drives them (server/http/http_server_internal.h): the
// response head, the transport's own error bodies, and the request's
// transfer-coding check.
//
// Thread-safety: pure functions.
#pragma once

#include <boost/beast/http.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "server/http/http_server.h"

namespace kvserve::http_internal {

// Case-insensitive ASCII comparison (header names and tokens).
bool IEquals(std::string_view a, std::string_view b);

// The transport's own refusals (framing, limits, timeouts) in the error
// object every JSON API client here reads: {"error": {"message", "type",
// "param": null, "code"}}. The transport knows nothing else of the protocol
// the routes speak.
HttpResponse ErrorResponse(int status, std::string message, std::string code,
                           std::string type = "invalid_request_error");

// The response head: status line and headers, up to the blank line.
std::string Head(const HttpResponse& r, bool keep_alive, int request_version,
                 std::optional<size_t> content_length, bool chunked);

// RFC 9112 6.1: the only transfer coding we decode is chunked, once, last.
// A refusal (400, or 501 for another coding) when the head breaks that.
std::optional<HttpResponse> CheckTransferEncoding(
    const boost::beast::http::request_parser<boost::beast::http::string_body>& p);

}  // namespace kvserve::http_internal
