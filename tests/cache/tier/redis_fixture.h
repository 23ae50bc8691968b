// A real redis-server for the remote tier's tests: started on a free
// loopback port in a fresh temporary directory (no persistence), stopped,
// paused or killed by its own pid. Skips (has_server() false) where the
// Debian package redis-server is not installed. GatedProxy: a TCP proxy in
// front of it whose replies are held while its gate is closed (a slow
// Redis the test controls, without timing).
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/tier/remote_tier.h"
#include "tests/test_util.h"

namespace kvserve::testing {

class RedisServer {
 public:
  RedisServer() {
    if (access("/usr/bin/redis-server", X_OK) != 0) return;
    dir_ = MakeTempDir("redis");
    port_ = FreePort();
    pid_ = fork();
    if (pid_ == 0) {
      // Dies with the test, and keeps none of its output pipes open.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null_fd = open("/dev/null", O_RDWR);
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(null_fd, 2);
      const std::string port = std::to_string(port_);
      execl("/usr/bin/redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
            "--dir", dir_.c_str(), "--save", "", "--appendonly", "no", "--logfile",
            (dir_ + "/redis.log").c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready when it answers PING (within 10 s).
    for (int i = 0; i < 1000 && !PingRedis(url(), 100).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~RedisServer() { Kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool has_server() const { return pid_ > 0; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  int port() const { return port_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  void Pause() { kill(pid_, SIGSTOP); }
  void Resume() { kill(pid_, SIGCONT); }

  // A command on a connection of its own (the test's view of the store).
  std::string Command(const std::string& cmd) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    std::string out;
    if (c != nullptr && c->err == 0) {
      auto* r = static_cast<redisReply*>(redisCommand(c, cmd.c_str()));
      if (r != nullptr) {
        if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
          out.assign(r->str, r->len);
        } else if (r->type == REDIS_REPLY_INTEGER) {
          out = std::to_string(r->integer);
        }
        freeReplyObject(r);
      }
    }
    if (c != nullptr) redisFree(c);
    return out;
  }
  // GET and SET of binary values.
  std::string Get(const std::string& key) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    std::string out;
    auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", key.data(), key.size()));
    if (r != nullptr && r->type == REDIS_REPLY_STRING) out.assign(r->str, r->len);
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
    return out;
  }
  void Set(const std::string& key, const std::string& value) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    auto* r = static_cast<redisReply*>(
        redisCommand(c, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
  }

 private:
  static int FreePort() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    return ntohs(a.sin_port);
  }

  std::string dir_;
  int port_ = 0;
  pid_t pid_ = 0;
};

// Forwards loopback connections to a Redis port: requests at once, replies
// only while the gate is open (held replies go out when it opens). Each
// accepted connection gets its own upstream connection; one thread polls
// them all.
class GatedProxy {
 public:
  explicit GatedProxy(int upstream_port) : upstream_(upstream_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(listen_fd_, 16);
    thread_ = std::thread([this] { Run(); });
  }
  ~GatedProxy() {
    stop_ = true;
    thread_.join();
    for (Pair& p : pairs_) {
      close(p.client);
      close(p.server);
    }
    close(listen_fd_);
  }
  GatedProxy(const GatedProxy&) = delete;
  GatedProxy& operator=(const GatedProxy&) = delete;

  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  void Close() { open_ = false; }
  void Open() { open_ = true; }
  // Reply bytes held back so far (the client is waiting on them).
  size_t held_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const Pair& p : pairs_) n += p.held.size();
    return n;
  }

 private:
  struct Pair {
    int client, server;
    std::string held;  // server -> client bytes not yet forwarded
  };
  static bool SendAll(int fd, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  void Run() {
    char buf[65536];
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const Pair& p : pairs_) {
          fds.push_back({p.client, POLLIN, 0});
          fds.push_back({p.server, POLLIN, 0});
        }
      }
      poll(fds.data(), fds.size(), 5);
      std::lock_guard<std::mutex> lock(mu_);
      if (fds[0].revents & POLLIN) {
        const int c = accept(listen_fd_, nullptr, nullptr);
        const int s = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(upstream_));
        if (c >= 0 && connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
          pairs_.push_back({c, s, {}});
        } else {
          if (c >= 0) close(c);
          close(s);
        }
      }
      std::vector<size_t> dead;
      for (size_t i = 0; i < pairs_.size(); ++i) {
        Pair& p = pairs_[i];
        bool ok = true;
        const size_t k = 1 + 2 * i;
        if (k < fds.size() && (fds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
          const ssize_t n = recv(p.client, buf, sizeof(buf), 0);
          ok = n > 0 && SendAll(p.server, buf, static_cast<size_t>(n));
        }
        if (ok && k + 1 < fds.size() && (fds[k + 1].revents & (POLLIN | POLLHUP | POLLERR))) {
          const ssize_t n = recv(p.server, buf, sizeof(buf), 0);
          if (n > 0) {
            p.held.append(buf, static_cast<size_t>(n));
          } else {
            ok = false;
          }
        }
        if (ok && open_ && !p.held.empty()) {
          ok = SendAll(p.client, p.held.data(), p.held.size());
          p.held.clear();
        }
        if (!ok) dead.push_back(i);
      }
      for (size_t j = dead.size(); j-- > 0;) {
        close(pairs_[dead[j]].client);
        close(pairs_[dead[j]].server);
        pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(dead[j]));
      }
    }
  }

  const int upstream_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> open_{true};
  std::mutex mu_;
  std::vector<Pair> pairs_;  // under mu_ (written by the proxy thread only)
  std::thread thread_;
};

// Polls `done` until it holds or 10 s pass (background work the test waits for).
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace kvserve::testing
