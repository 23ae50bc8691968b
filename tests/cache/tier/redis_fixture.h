// A real redis-server for the remote tier's tests: started on a free
// loopback port in a fresh temporary directory (no persistence), stopped,
// paused or killed by its own pid. Skips (has_server() false) where the
// Debian package redis-server is not installed.
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

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
