// DaemonProcess: the real `kvserve serve` binary as a child process for the
// daemon integration tests. It serves stories260K on free loopback ports
// (bound once to find them; start-up is retried on a lost race), logs to a
// file in a test scratch directory, and is ready once GET /health answers
// 200. The destructor kills the child if it is still running, so a failed
// test never leaves a daemon behind.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/test_util.h"

extern char** environ;

namespace kvserve::testing {

// A loopback port nobody listens on right now.
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

class DaemonProcess {
 public:
  // `sets` are extra `--set key=value` overrides.
  explicit DaemonProcess(std::vector<std::string> sets = {}) : sets_(std::move(sets)) {
    dir_ = MakeTempDir("daemon");
    config_path_ = dir_ + "/kvserve.yaml";
    std::ofstream(config_path_) << "model:\n"
                                << "  path: " << Stories260kCheckpoint() << "\n"
                                << "  tokenizer: " << Stories260kTokenizer() << "\n"
                                << "  name: stories260k\n"
                                << "server:\n"
                                << "  host: 127.0.0.1\n"
                                << "  shutdown_timeout: 60\n"
                                << "logging:\n"
                                << "  level: info\n";
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (Start()) return;
      // Another process took a port between our probe and the bind: retry.
      if (Log().find("cannot listen") == std::string::npos) break;
    }
    FAIL("kvserve serve did not become ready; its log:\n" << Log());
  }

  ~DaemonProcess() {
    if (pid_ > 0 && !Exited(/*wait=*/false)) {
      kill(pid_, SIGKILL);
      Exited(/*wait=*/true);
    }
    ClosePidfd();
  }

  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  int http_port() const { return http_port_; }
  int grpc_port() const { return grpc_port_; }
  std::string grpc_target() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(http_port_); }
  const std::string& dir() const { return dir_; }

  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", http_port_);
    c.set_connection_timeout(30, 0);
    c.set_read_timeout(120, 0);
    return c;
  }

  std::string Log() const {
    std::ifstream in(log_path_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  void Signal(int sig) const { kill(pid_, sig); }

  // Waits (bounded) for the child to exit; its exit code, or -1 on a
  // timeout or a death by signal. Wakes on the exit itself (a pidfd turns
  // readable when the child ends).
  int WaitForExit(std::chrono::seconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!Exited(/*wait=*/false)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return -1;
      WaitForChildExit(left);
    }
    return exit_code_;
  }

 private:
  // Spawns the daemon and waits for /health; false when it exited first.
  bool Start() {
    http_port_ = FreeLoopbackPort();
    grpc_port_ = FreeLoopbackPort();
    while (grpc_port_ == http_port_) grpc_port_ = FreeLoopbackPort();
    log_path_ = dir_ + "/kvserve.log";
    std::vector<std::string> args = {
        KvserveBinary(), "serve",
        "--config",      config_path_,
        "--set",         "server.http_port=" + std::to_string(http_port_),
        "--set",         "server.grpc_port=" + std::to_string(grpc_port_)};
    for (const std::string& s : sets_) {
      args.push_back("--set");
      args.push_back(s);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
    exited_ = false;
    ClosePidfd();
    pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    REQUIRE(pidfd_ >= 0);

    // Readiness has no event the child could signal us with short of a
    // protocol of our own, so this stays a bounded poll of /health; between
    // tries it waits on the child's exit, so a daemon that dies at start-up
    // ends the wait at once.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < end) {
      if (Exited(/*wait=*/false)) return false;
      httplib::Client c("127.0.0.1", http_port_);
      c.set_connection_timeout(1, 0);
      if (auto r = c.Get("/health"); r && r->status == 200) return true;
      WaitForChildExit(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    Exited(/*wait=*/true);
    return false;
  }

  // Returns when the child has exited or after `timeout`.
  void WaitForChildExit(std::chrono::milliseconds timeout) const {
    pollfd p{pidfd_, POLLIN, 0};
    poll(&p, 1, static_cast<int>(timeout.count()));
  }

  void ClosePidfd() {
    if (pidfd_ >= 0) close(pidfd_);
    pidfd_ = -1;
  }

  bool Exited(bool wait) {
    if (exited_) return true;
    int status = 0;
    pid_t r = waitpid(pid_, &status, wait ? 0 : WNOHANG);
    if (r != pid_) return false;
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  }

  std::vector<std::string> sets_;
  std::string dir_;
  std::string config_path_;
  std::string log_path_;
  pid_t pid_ = -1;
  int pidfd_ = -1;  // readable once the child exits
  bool exited_ = false;
  int exit_code_ = -1;
  int http_port_ = 0;
  int grpc_port_ = 0;
};

// The "data: " payloads of an SSE body, in order ("[DONE]" included).
inline std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

// Runs a command through the shell; its exit code, with stdout+stderr in *out.
inline int RunCommand(const std::string& cmd, std::string* out) {
  return RunShell(cmd + " 2>&1", out);
}

}  // namespace kvserve::testing
