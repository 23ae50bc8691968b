// RawHttp: a blocking HTTP/1.1 client on a plain socket for tests that must
// send what a well-behaved client library will not (conflicting framing,
// half a head, pipelined requests, a body nobody reads) and see exactly
// what comes back, including whether the server closed the connection.
//
// Thread-safety: one RawConnection per thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace kvserve::testing {

struct RawResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;  // chunked bodies decoded
  // A header's value ("" when absent); names compared case-insensitively.
  std::string Header(std::string_view name) const {
    size_t pos = head.find("\r\n");
    while (pos != std::string::npos && pos + 2 < head.size()) {
      const size_t start = pos + 2;
      const size_t end = head.find("\r\n", start);
      const std::string line = head.substr(start, end - start);
      const size_t colon = line.find(':');
      if (colon == name.size() && strncasecmp(line.data(), name.data(), name.size()) == 0) {
        size_t v = colon + 1;
        while (v < line.size() && line[v] == ' ') ++v;
        return line.substr(v);
      }
      pos = end;
    }
    return "";
  }
};

// Raises the soft open-file limit to the hard one (many sockets per test).
inline void RaiseOpenFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

class RawConnection {
 public:
  // Connects to 127.0.0.1:port; `rcvbuf` > 0 shrinks the receive buffer
  // (a client that reads slowly, or never).
  explicit RawConnection(int port, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() { Close(); }
  RawConnection(RawConnection&& o) noexcept
      : fd_(o.fd_), closed_(o.closed_), in_(std::move(o.in_)) {
    o.fd_ = -1;
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  // Sends all of `bytes`; false when the peer is gone.
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // One response (Content-Length, chunked, or up to the close); nullopt on
  // a timeout or a close before a whole response.
  std::optional<RawResponse> ReadResponse(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t head_end;
    while ((head_end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill(deadline)) return std::nullopt;
    }
    RawResponse r;
    r.head = in_.substr(0, head_end);
    in_.erase(0, head_end + 4);
    if (r.head.size() < 12) return std::nullopt;
    r.status = std::atoi(r.head.c_str() + 9);
    if (r.status == 100) return ReadResponse(timeout);
    const std::string length = r.Header("Content-Length");
    if (!length.empty()) {
      const size_t n = std::strtoull(length.c_str(), nullptr, 10);
      while (in_.size() < n) {
        if (!Fill(deadline)) return std::nullopt;
      }
      r.body = in_.substr(0, n);
      in_.erase(0, n);
      return r;
    }
    if (strcasecmp(r.Header("Transfer-Encoding").c_str(), "chunked") == 0) {
      for (;;) {
        size_t line_end;
        while ((line_end = in_.find("\r\n")) == std::string::npos) {
          if (!Fill(deadline)) return std::nullopt;
        }
        const size_t size = std::strtoull(in_.c_str(), nullptr, 16);
        while (in_.size() < line_end + 2 + size + 2) {
          if (!Fill(deadline)) return std::nullopt;
        }
        r.body.append(in_, line_end + 2, size);
        in_.erase(0, line_end + 2 + size + 2);
        if (size == 0) return r;
      }
    }
    while (Fill(deadline)) {
    }
    if (!closed_) return std::nullopt;
    r.body = std::move(in_);
    in_.clear();
    return r;
  }

  // True once the peer has closed (EOF or reset) within `timeout`; what
  // arrives meanwhile is dropped.
  bool WaitClosed(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Fill(deadline)) in_.clear();
    return closed_;
  }

  // Bytes received but not yet part of a response read.
  const std::string& unread() const { return in_; }

 private:
  // Reads what is there (waiting until the deadline); false on a close
  // (closed_ set) or the deadline.
  bool Fill(std::chrono::steady_clock::time_point deadline) {
    if (fd_ < 0 || closed_) return false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      char buf[16384];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        closed_ = true;
        return false;
      }
      in_.append(buf, static_cast<size_t>(n));
      return true;
    }
  }

  int fd_ = -1;
  bool closed_ = false;
  std::string in_;
};

}  // namespace kvserve::testing
