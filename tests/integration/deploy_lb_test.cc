// deploy/ end to end: two real `kvserve serve` replicas (configs/default.yaml
// on loopback ports) behind nginx running deploy/nginx/kvserve.conf.template
// as rendered by deploy/nginx/render.sh. Through the load balancer: greedy
// completions equal the replicas' own answers and both replicas serve,
// X-Request-Id travels both ways, X-Prefix-Key pins a conversation to one
// replica, client_max_body_size is the replicas' server.max_body_bytes, SSE
// streams through unbuffered, gRPC passes over HTTP/2, and a draining
// replica's 503 is retried on the other one. A rolling restart under load
// (HTTP SSE and gRPC streams): one replica leaves the rotation and gets
// SIGTERM mid-run, every request completes whole and later ones reach the
// survivor. The dns rendering follows a name whose answers change while
// nginx runs (a stub DNS server, tests/deploy/dns_stub.py), and `nginx -t`
// accepts it where the name does not resolve. Everything stops cleanly: the
// replicas exit 0 on SIGTERM and nginx on SIGQUIT.
//
// Also checks, without starting anything, that the Kubernetes manifests and
// container configs in deploy/ parse and agree with each other (their API
// schemas: tests/deploy/manifests_test.cc).
//
// Needs nginx (Debian package `nginx`, installed by scripts/install-deps.sh)
// and python3 for the stub DNS server.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/kvserve.grpc.pb.h"
#include "server/config/config.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kNginx[] = "/usr/sbin/nginx";

std::string SourcePath(const std::string& relative) {
  return std::string(KVSERVE_SOURCE_DIR) + "/" + relative;
}

// A child process with stdout and stderr in a log file, in its own process
// group so that nginx's workers go with their master. The destructor kills
// the group if the child is still running: a failed REQUIRE leaves nothing
// behind.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> args, std::string log_path)
      : log_path_(std::move(log_path)) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
  }

  // Still running here means the test stopped early: show why.
  ~ChildProcess() {
    if (!Exited(/*wait=*/false)) {
      kill(-pid_, SIGKILL);
      Exited(/*wait=*/true);
      const std::string log = Log();
      std::fprintf(stderr, "--- killed at test end; %s ends with:\n%s\n", log_path_.c_str(),
                   log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
    }
  }

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool Running() { return !Exited(/*wait=*/false); }
  void Signal(int sig) {
    if (Running()) kill(pid_, sig);
  }

  // The exit code once the child exits within `timeout`; -1 on a timeout or
  // a death by signal.
  int WaitForExit(std::chrono::seconds timeout) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (Exited(/*wait=*/false)) return exit_code_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  std::string Log() const {
    std::ifstream in(log_path_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  bool Exited(bool wait) {
    if (exited_) return true;
    int status = 0;
    if (waitpid(pid_, &status, wait ? 0 : WNOHANG) != pid_) return false;
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  }

  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
};

httplib::Client LoopbackClient(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(120, 0);
  return c;
}

// Polls GET `path` until it answers `status`; false when `child` exits first
// or the deadline passes.
bool WaitForStatus(ChildProcess& child, int port, const std::string& path, int status,
                   std::chrono::seconds timeout = std::chrono::seconds(60),
                   const std::string& host = "127.0.0.1") {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (!child.Running()) return false;
    httplib::Client c(host, port);
    c.set_connection_timeout(1, 0);
    if (auto r = c.Get(path.c_str()); r && r->status == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct Replica {
  std::unique_ptr<ChildProcess> process;
  int http_port = 0;
  int grpc_port = 0;
  std::string http_addr() const { return "127.0.0.1:" + std::to_string(http_port); }
};

// A minimal nginx.conf in dir that includes dir/kvserve.conf (a rendering),
// with its temp paths under dir/temp.
void WriteNginxConf(const std::string& dir, int worker_connections) {
  fs::create_directories(dir + "/temp");
  std::ofstream(dir + "/nginx.conf")
      << "worker_processes 1;\n"
      << "events { worker_connections " << worker_connections << "; }\n"
      << "http {\n"
      << "    client_body_temp_path temp/body;\n"
      << "    proxy_temp_path temp/proxy;\n"
      << "    fastcgi_temp_path temp/fastcgi;\n"
      << "    uwsgi_temp_path temp/uwsgi;\n"
      << "    scgi_temp_path temp/scgi;\n"
      << "    include kvserve.conf;\n"
      << "}\n";
}

// `kvserve serve` on the shipped configs/default.yaml, with the reference
// model's paths (KVSERVE_SHARED may move them) and free ports.
Replica StartReplica(const std::string& dir, const std::string& name,
                     const std::vector<std::string>& extra_sets = {}) {
  const std::string log = dir + "/" + name + ".log";
  for (int attempt = 0; attempt < 3; ++attempt) {
    Replica r;
    r.http_port = testing::FreeLoopbackPort();
    do {
      r.grpc_port = testing::FreeLoopbackPort();
    } while (r.grpc_port == r.http_port);
    std::vector<std::string> args = {testing::KvserveBinary(),
                                     "serve",
                                     "--config",
                                     SourcePath("configs/default.yaml"),
                                     "--set",
                                     "model.path=" + testing::Stories260kCheckpoint(),
                                     "--set",
                                     "model.tokenizer=" + testing::Stories260kTokenizer(),
                                     "--set",
                                     "server.host=127.0.0.1",
                                     "--set",
                                     "server.http_port=" + std::to_string(r.http_port),
                                     "--set",
                                     "server.grpc_port=" + std::to_string(r.grpc_port)};
    for (const std::string& s : extra_sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    r.process = std::make_unique<ChildProcess>(args, log);
    if (WaitForStatus(*r.process, r.http_port, "/health", 200)) return r;
    // A port taken between the probe and the daemon's bind: try others.
    if (r.process->Log().find("cannot listen") == std::string::npos) {
      FAIL("replica " << name << " did not become ready; its log:\n" << r.process->Log());
    }
  }
  FAIL("replica " << name << " found no free ports");
  return {};
}

struct Balancer {
  std::unique_ptr<ChildProcess> process;
  int http_port = 0;
  int grpc_port = 0;
  std::string access_log;
};

// Renders the shipped template for `replicas` with render.sh and runs nginx
// on it, in the foreground, with everything it writes under `dir`.
// The render.sh command line for `replicas` (static mode) with the daemon's
// configs/default.yaml as the body-size source.
std::string RenderCommand(const Balancer& b, const std::vector<const Replica*>& replicas,
                          const std::string& out) {
  std::string cmd = "bash " + SourcePath("deploy/nginx/render.sh") + " --config " +
                    SourcePath("configs/default.yaml") +
                    " --http-listen 127.0.0.1:" + std::to_string(b.http_port) +
                    " --grpc-listen 127.0.0.1:" + std::to_string(b.grpc_port) + " --access-log " +
                    b.access_log;
  for (const Replica* r : replicas) {
    cmd += " 127.0.0.1:" + std::to_string(r->http_port) + ":" + std::to_string(r->grpc_port);
  }
  return cmd + " > " + out;
}

Balancer StartNginx(const std::string& dir, const std::vector<const Replica*>& replicas) {
  if (!fs::exists(kNginx)) {
    FAIL(kNginx << " is missing: install nginx with scripts/install-deps.sh "
                   "(Debian package nginx)");
  }
  // As root, nginx's workers run as `nobody` and must reach their temp dirs.
  chmod(dir.c_str(), 0755);
  WriteNginxConf(dir, 512);
  for (int attempt = 0; attempt < 3; ++attempt) {
    Balancer b;
    b.http_port = testing::FreeLoopbackPort();
    do {
      b.grpc_port = testing::FreeLoopbackPort();
    } while (b.grpc_port == b.http_port);
    b.access_log = dir + "/access.log";
    const std::string cmd = RenderCommand(b, replicas, dir + "/kvserve.conf");
    std::string out;
    INFO(out);
    REQUIRE(testing::RunCommand(cmd, &out) == 0);

    b.process = std::make_unique<ChildProcess>(
        std::vector<std::string>{kNginx, "-e", "stderr", "-p", dir + "/", "-c", "nginx.conf", "-g",
                                 "daemon off; pid " + dir + "/nginx.pid; error_log stderr notice;"},
        dir + "/nginx.log");
    // Healthy once nginx listens and has reached a ready replica.
    if (WaitForStatus(*b.process, b.http_port, "/health", 200, std::chrono::seconds(20))) {
      return b;
    }
    if (b.process->Log().find("Address already in use") == std::string::npos) {
      FAIL("nginx did not come up; its log:\n" << b.process->Log());
    }
  }
  FAIL("nginx found no free ports");
  return {};
}

std::string CompletionBody(const std::string& prompt, bool stream, bool ignore_eos = false,
                           int max_tokens = 256) {
  json body = {{"model", "stories260k"},
               {"prompt", prompt},
               {"max_tokens", max_tokens},
               {"temperature", 0},
               {"stream", stream}};
  if (ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

std::string CompletionText(const httplib::Result& r) {
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

// Sum over the finish_reason series of kvserve_requests_total.
double FinishedRequests(int port) {
  auto r = LoopbackClient(port).Get("/metrics");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  double sum = 0;
  const std::string prefix = "kvserve_requests_total{";
  size_t pos = 0;
  while ((pos = r->body.find("\n" + prefix, pos)) != std::string::npos) {
    const size_t value = r->body.find("} ", pos) + 2;
    sum += std::stod(r->body.substr(value, r->body.find('\n', value) - value));
    pos = value;
  }
  return sum;
}

// Waits (bounded) until the replica's finished-request count reaches
// `expected`: counters move when a request ends, a moment after its reply.
double WaitForFinishedRequests(int port, double expected) {
  const auto end = Clock::now() + std::chrono::seconds(10);
  double got = FinishedRequests(port);
  while (got != expected && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    got = FinishedRequests(port);
  }
  return got;
}

double Gauge(int port, const std::string& name) {
  auto r = LoopbackClient(port).Get("/metrics");
  REQUIRE(r);
  const size_t pos = r->body.find("\n" + name + " ");
  REQUIRE(pos != std::string::npos);
  const size_t value = pos + name.size() + 2;
  return std::stod(r->body.substr(value, r->body.find('\n', value) - value));
}

// "a, b" (nginx lists every upstream it tried) -> {"a", "b"}.
std::vector<std::string> Tried(const std::string& upstream_header) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= upstream_header.size()) {
    size_t end = upstream_header.find(", ", pos);
    if (end == std::string::npos) end = upstream_header.size();
    out.push_back(upstream_header.substr(pos, end - pos));
    pos = end + 2;
  }
  return out;
}

const std::vector<std::string> kPrompts = {
    "",
    "Once upon a time",
    "Lily wanted",
    "The little dog",
    "Tom and his",
    "One day, a bird",
    "The sun was",
    "Mom said",
};

TEST_CASE("Deploy: two replicas behind the shipped nginx config", "[integration]") {
  const std::string dir = testing::MakeTempDir("deploy-lb");
  // A serves one sequence at a time, so that it can be caught draining with
  // work in flight further down.
  Replica a = StartReplica(dir, "replica-a", {"scheduler.max_num_seqs=1"});
  Replica b = StartReplica(dir, "replica-b");
  Balancer lb = StartNginx(dir, {&a, &b});

  // The reference: each prompt's greedy text straight from replica A.
  std::vector<std::string> reference;
  for (const std::string& prompt : kPrompts) {
    reference.push_back(CompletionText(
        LoopbackClient(a.http_port)
            .Post("/v1/completions", CompletionBody(prompt, false), "application/json")));
  }
  REQUIRE(reference[0] == testing::GoldenGreedyText());

  // 8 concurrent greedy completions through nginx: each equals its reference,
  // keeps its X-Request-Id, and least_conn spreads them over both replicas.
  struct Answer {
    int status = -1;
    std::string text, request_id, upstream;
  };
  std::vector<Answer> answers(kPrompts.size());
  {
    std::vector<std::jthread> clients;  // joined on every way out of this block
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      clients.emplace_back([&, i] {
        httplib::Headers headers = {{"X-Request-Id", "lb-test-" + std::to_string(i)}};
        auto r = LoopbackClient(lb.http_port)
                     .Post("/v1/completions", headers, CompletionBody(kPrompts[i], false),
                           "application/json");
        if (!r) return;
        answers[i].status = r->status;
        if (r->status == 200) answers[i].text = json::parse(r->body)["choices"][0]["text"];
        answers[i].request_id = r->get_header_value("X-Request-Id");
        answers[i].upstream = r->get_header_value("X-Upstream");
      });
    }
    clients.clear();
  }
  std::map<std::string, int> served;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    INFO("prompt '" << kPrompts[i] << "' via " << answers[i].upstream);
    REQUIRE(answers[i].status == 200);
    REQUIRE(answers[i].text == reference[i]);
    REQUIRE(answers[i].request_id == "lb-test-" + std::to_string(i));
    ++served[answers[i].upstream];
  }
  REQUIRE(served.size() == 2);
  REQUIRE(served.count(a.http_addr()) == 1);
  REQUIRE(served.count(b.http_addr()) == 1);
  // The replicas' own counters agree: A also answered the 8 references.
  REQUIRE(WaitForFinishedRequests(a.http_port, 8 + served[a.http_addr()]) ==
          8 + served[a.http_addr()]);
  REQUIRE(WaitForFinishedRequests(b.http_port, served[b.http_addr()]) == served[b.http_addr()]);

  // Without an X-Request-Id nginx makes one ($request_id, 32 hex digits) and
  // the replica that served the request logs under it.
  {
    auto r =
        LoopbackClient(lb.http_port)
            .Post("/v1/completions", CompletionBody("Once upon a time", false), "application/json");
    REQUIRE(CompletionText(r) == reference[1]);
    const std::string id = r->get_header_value("X-Request-Id");
    REQUIRE(id.size() == 32);
    REQUIRE(std::all_of(id.begin(), id.end(), [](char c) { return std::isxdigit(c) != 0; }));
    const std::string upstream = r->get_header_value("X-Upstream");
    const Replica& server = upstream == a.http_addr() ? a : b;
    REQUIRE(upstream == server.http_addr());
    const auto end = Clock::now() + std::chrono::seconds(5);
    while (server.process->Log().find(id) == std::string::npos && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(server.process->Log().find(id) != std::string::npos);
  }

  // X-Prefix-Key pins a conversation to one replica (consistent hash).
  for (const std::string key : {"conversation-1", "conversation-2", "conversation-3"}) {
    INFO(key);
    std::set<std::string> upstreams;
    for (int i = 0; i < 3; ++i) {
      auto r = LoopbackClient(lb.http_port)
                   .Post("/v1/completions", {{"X-Prefix-Key", key}},
                         CompletionBody("Once upon a time", false), "application/json");
      REQUIRE(CompletionText(r) == reference[1]);
      upstreams.insert(r->get_header_value("X-Upstream"));
    }
    REQUIRE(upstreams.size() == 1);
  }

  // client_max_body_size is the replicas' server.max_body_bytes (8MiB in
  // configs/default.yaml, rendered from it): one byte more is refused by
  // nginx itself, a body of exactly the limit reaches a replica.
  {
    // JSON allows any amount of white space before the closing brace.
    const std::string body = CompletionBody("Once upon a time", false);
    constexpr size_t kLimit = 8 * 1024 * 1024;
    std::string over = body;
    over.insert(over.size() - 1, std::string(kLimit + 1 - body.size(), ' '));
    auto r = LoopbackClient(lb.http_port).Post("/v1/completions", over, "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 413);
    REQUIRE(r->get_header_value("X-Upstream").empty());
    std::string at = body;
    at.insert(at.size() - 1, std::string(kLimit - body.size(), ' '));
    REQUIRE(CompletionText(
                LoopbackClient(lb.http_port).Post("/v1/completions", at, "application/json")) ==
            reference[1]);
  }

  // SSE through nginx: many events, arriving over many reads rather than as
  // one body at the end, ending with [DONE] and concatenating to the
  // reference.
  {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = CompletionBody("", /*stream=*/true);
    req.set_header("Content-Type", "application/json");
    std::string received;
    int reads = 0;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      received.append(data, len);
      ++reads;
      return true;
    };
    auto r = LoopbackClient(lb.http_port).send(req);
    REQUIRE(r);
    REQUIRE(r->status == 200);
    REQUIRE(r->get_header_value("Content-Type") == "text/event-stream");
    std::vector<std::string> events = testing::SseData(received);
    REQUIRE(events.size() > 10);
    REQUIRE(events.back() == "[DONE]");
    std::string text;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json chunk = json::parse(events[i]);
      if (!chunk["choices"].empty()) text += chunk["choices"][0]["text"].get<std::string>();
    }
    REQUIRE(text == testing::GoldenGreedyText());
    INFO(reads << " reads");
    REQUIRE(reads > 1);
  }

  // gRPC through nginx's HTTP/2 proxy: the streamed greedy text.
  {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(lb.grpc_port),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Generation::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest req;
    req.set_prompt("");
    req.set_max_tokens(256);
    req.mutable_sampling()->set_temperature(0);
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    std::string text;
    int responses = 0;
    bool finished = false;
    while (reader->Read(&resp)) {
      text += resp.text();
      ++responses;
      finished = finished || resp.request_finished();
    }
    grpc::Status status = reader->Finish();
    INFO(status.error_message());
    REQUIRE(status.ok());
    REQUIRE(finished);
    REQUIRE(responses > 1);
    REQUIRE(text == testing::GoldenGreedyText());
  }

  // A rolling restart: replica A drains with a backlog of long streams (one
  // sequence at a time); new requests through nginx still all succeed, the
  // ones sent to A first being refused with 503 and retried on B.
  // jthreads: a failed REQUIRE below still joins them, before A is killed.
  std::vector<std::jthread> backlog;
  for (int i = 0; i < 16; ++i) {
    backlog.emplace_back([&] {
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = CompletionBody("Once upon a time", true, /*ignore_eos=*/true, 440);
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [](const char*, size_t, uint64_t, uint64_t) { return true; };
      LoopbackClient(a.http_port).send(req);
    });
  }
  {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Gauge(a.http_port, "kvserve_queue_length") < 4 && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(Gauge(a.http_port, "kvserve_queue_length") >= 4);
  }
  a.process->Signal(SIGTERM);
  REQUIRE(WaitForStatus(*a.process, a.http_port, "/health", 503, std::chrono::seconds(10)));
  int retried_after_503 = 0;
  for (int i = 0; i < 4; ++i) {
    auto r = LoopbackClient(lb.http_port)
                 .Post("/v1/completions", CompletionBody(kPrompts[2], false), "application/json");
    REQUIRE(CompletionText(r) == reference[2]);
    const std::vector<std::string> tried = Tried(r->get_header_value("X-Upstream"));
    INFO(r->get_header_value("X-Upstream"));
    REQUIRE(tried.back() == b.http_addr());
    if (tried.size() == 2 && tried[0] == a.http_addr()) ++retried_after_503;
  }
  // A was still draining (its backlog takes seconds), so those were 503s.
  REQUIRE(a.process->Running());
  REQUIRE(retried_after_503 >= 1);
  {
    std::ifstream in(lb.access_log);
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(log);
    REQUIRE(log.find("upstream_status=503, 200") != std::string::npos);
  }

  // Everything stops cleanly.
  backlog.clear();
  {
    INFO(a.process->Log());
    REQUIRE(a.process->WaitForExit(std::chrono::seconds(60)) == 0);
  }
  b.process->Signal(SIGTERM);
  {
    INFO(b.process->Log());
    REQUIRE(b.process->WaitForExit(std::chrono::seconds(60)) == 0);
  }
  lb.process->Signal(SIGQUIT);  // graceful: finish open requests, then exit
  REQUIRE(lb.process->WaitForExit(std::chrono::seconds(20)) == 0);
}

// One request of the rolling-restart load: which replica served it, when it
// ran, and whether it came back whole.
struct LoadRecord {
  bool grpc = false;
  Clock::time_point start, end;
  std::string upstream;  // nginx's X-Upstream: the replica's address
  bool ok = false;
  std::string error;
};

// A streamed completion through nginx's HTTP port: ok when the SSE stream
// ends with [DONE] and its text equals `expected`.
LoadRecord StreamHttp(int port, const std::string& body, const std::string& expected) {
  LoadRecord rec;
  rec.start = Clock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  std::string received;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    received.append(data, len);
    return true;
  };
  auto r = LoopbackClient(port).send(req);
  rec.end = Clock::now();
  if (!r) {
    rec.error = "no response: " + httplib::to_string(r.error());
    return rec;
  }
  rec.upstream = r->get_header_value("X-Upstream");
  std::vector<std::string> events = testing::SseData(received);
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i], nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded()) break;
    if (!chunk["choices"].empty()) text += chunk["choices"][0]["text"].get<std::string>();
  }
  rec.ok = r->status == 200 && !events.empty() && events.back() == "[DONE]" && text == expected;
  if (!rec.ok) rec.error = "HTTP " + std::to_string(r->status) + ": " + received.substr(0, 300);
  return rec;
}

// A streamed gRPC Generate through nginx's HTTP/2 port: ok when the call
// ends OK, finished, with the text `expected`.
LoadRecord StreamGrpc(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                      const std::string& expected) {
  LoadRecord rec;
  rec.grpc = true;
  rec.start = Clock::now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  std::string text;
  bool finished = false;
  while (reader->Read(&resp)) {
    text += resp.text();
    finished = finished || resp.request_finished();
  }
  grpc::Status status = reader->Finish();
  rec.end = Clock::now();
  for (const auto& [key, value] : ctx.GetServerInitialMetadata()) {
    if (key == "x-upstream") rec.upstream.assign(value.data(), value.size());
  }
  rec.ok = status.ok() && finished && text == expected;
  if (!rec.ok) {
    rec.error = "gRPC " + std::to_string(status.error_code()) + " " + status.error_message() +
                (finished ? "" : " (not finished)") + (text == expected ? "" : " (text differs)");
  }
  return rec;
}

TEST_CASE("Deploy: a rolling restart of one replica under load loses no request", "[integration]") {
  const std::string dir = testing::MakeTempDir("deploy-rolling");
  // A serves one sequence at a time, so that requests queue there and some
  // are surely in flight when it is told to stop.
  Replica a = StartReplica(dir, "replica-a", {"scheduler.max_num_seqs=1"});
  Replica b = StartReplica(dir, "replica-b");
  Balancer lb = StartNginx(dir, {&a, &b});

  // Long streams (ignore_eos), all the same: the reference text from B.
  const std::string body = CompletionBody("Once upon a time", /*stream=*/true,
                                          /*ignore_eos=*/true, 440);
  json plain = json::parse(body);
  plain["stream"] = false;
  const std::string expected = CompletionText(
      LoopbackClient(b.http_port).Post("/v1/completions", plain.dump(), "application/json"));
  v1::GenerateRequest grpc_req;
  grpc_req.set_prompt("Once upon a time");
  grpc_req.set_max_tokens(440);
  grpc_req.set_ignore_eos(true);
  grpc_req.mutable_sampling()->set_temperature(0);

  // The load: 5 HTTP SSE clients and 5 gRPC streaming clients, each sending
  // one request after the other until told to stop (bounded in count).
  // least_conn keeps about as many open at A as at B, and A runs one at a
  // time: a backlog there.
  constexpr int kClients = 5;
  constexpr int kMaxPerClient = 40;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<LoadRecord> records;
  auto record = [&](LoadRecord rec) {
    std::lock_guard<std::mutex> lock(mu);
    records.push_back(std::move(rec));
  };
  std::vector<std::jthread> clients;  // joined on every way out
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < kMaxPerClient && !stop; ++i)
        record(StreamHttp(lb.http_port, body, expected));
    });
    clients.emplace_back([&] {
      auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(lb.grpc_port),
                                         grpc::InsecureChannelCredentials());
      auto stub = v1::Generation::NewStub(channel);
      for (int i = 0; i < kMaxPerClient && !stop; ++i)
        record(StreamGrpc(*stub, grpc_req, expected));
    });
  }
  auto served_by = [&](const std::string& http_addr, const std::string& grpc_addr, bool grpc) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(records.begin(), records.end(), [&](const LoadRecord& r) {
      return r.grpc == grpc && r.upstream == (grpc ? grpc_addr : http_addr);
    });
  };
  const std::string a_grpc = "127.0.0.1:" + std::to_string(a.grpc_port);
  const std::string b_grpc = "127.0.0.1:" + std::to_string(b.grpc_port);

  // Both replicas serve both protocols, and A has work queued.
  {
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < end && !(served_by(a.http_addr(), a_grpc, false) > 0 &&
                                   served_by(a.http_addr(), a_grpc, true) > 0 &&
                                   served_by(b.http_addr(), b_grpc, false) > 0 &&
                                   served_by(b.http_addr(), b_grpc, true) > 0 &&
                                   Gauge(a.http_port, "kvserve_queue_length") >= 2)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  REQUIRE(served_by(a.http_addr(), a_grpc, false) > 0);
  REQUIRE(served_by(a.http_addr(), a_grpc, true) > 0);
  REQUIRE(served_by(b.http_addr(), b_grpc, false) > 0);
  REQUIRE(served_by(b.http_addr(), b_grpc, true) > 0);
  REQUIRE(Gauge(a.http_port, "kvserve_queue_length") >= 2);

  // The rolling restart of A, as Kubernetes does it: first out of rotation
  // (the pod leaves the endpoints; here: nginx re-rendered without A and
  // reloaded, its old worker finishing the open streams), then SIGTERM.
  std::string out;
  REQUIRE(testing::RunCommand(RenderCommand(lb, {&b}, dir + "/kvserve.conf"), &out) == 0);
  // Reloaded once the new worker runs and the old one stopped accepting
  // (nginx's notices, error_log stderr notice).
  auto count = [&](const std::string& what) {
    const std::string log = lb.process->Log();
    size_t n = 0;
    for (size_t pos = 0; (pos = log.find(what, pos)) != std::string::npos; ++pos) ++n;
    return n;
  };
  const size_t started_before = count("start worker process");
  const size_t quitting_before = count("gracefully shutting down");
  lb.process->Signal(SIGHUP);
  {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while ((count("start worker process") == started_before ||
            count("gracefully shutting down") == quitting_before) &&
           Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    INFO(lb.process->Log());
    REQUIRE(count("start worker process") > started_before);
    REQUIRE(count("gracefully shutting down") > quitting_before);
  }
  const auto reloaded = Clock::now();
  a.process->Signal(SIGTERM);
  const auto sigterm = Clock::now();
  {
    INFO(a.process->Log());
    REQUIRE(a.process->WaitForExit(std::chrono::seconds(60)) == 0);  // drained, then exited
  }
  // Keep the load on a little longer, on B alone.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  clients.clear();

  // Every request of the run came back whole.
  int in_flight_on_a = 0;
  for (const LoadRecord& r : records) {
    INFO((r.grpc ? "gRPC" : "HTTP") << " via " << r.upstream << ": " << r.error);
    REQUIRE(r.ok);
    if (r.upstream == (r.grpc ? a_grpc : a.http_addr()) && r.start < sigterm && r.end > sigterm) {
      ++in_flight_on_a;
    }
    // Requests sent after A left the rotation reached B.
    if (r.start > reloaded) REQUIRE(r.upstream == (r.grpc ? b_grpc : b.http_addr()));
  }
  INFO(records.size() << " requests");
  REQUIRE(in_flight_on_a >= 1);  // A finished what it had when SIGTERM came
  REQUIRE(std::count_if(records.begin(), records.end(),
                        [&](const LoadRecord& r) { return r.start > sigterm; }) >= 2);

  b.process->Signal(SIGTERM);
  REQUIRE(b.process->WaitForExit(std::chrono::seconds(60)) == 0);
  lb.process->Signal(SIGQUIT);
  REQUIRE(lb.process->WaitForExit(std::chrono::seconds(20)) == 0);
}

// dns mode end to end: two replicas on the same ports at 127.0.0.2 and
// 127.0.0.3 behind one name, served by a stub DNS server
// (tests/deploy/dns_stub.py) whose answers the test changes, as a headless
// Service's change when a pod leaves the endpoints.
TEST_CASE("Deploy: nginx in dns mode follows the replicas' name while running", "[integration]") {
  const std::string python = testing::PythonWithModule("socket");
  REQUIRE(!python.empty());
  const std::string dir = testing::MakeTempDir("deploy-dns");
  const int http_port = testing::FreeLoopbackPort();
  int grpc_port = testing::FreeLoopbackPort();
  while (grpc_port == http_port) grpc_port = testing::FreeLoopbackPort();
  auto start = [&](const std::string& host, const std::string& name) {
    Replica r;
    r.http_port = http_port;
    r.grpc_port = grpc_port;
    r.process = std::make_unique<ChildProcess>(
        std::vector<std::string>{
            testing::KvserveBinary(), "serve", "--config", SourcePath("configs/default.yaml"),
            "--set", "model.path=" + testing::Stories260kCheckpoint(), "--set",
            "model.tokenizer=" + testing::Stories260kTokenizer(), "--set", "server.host=" + host,
            "--set", "server.http_port=" + std::to_string(http_port), "--set",
            "server.grpc_port=" + std::to_string(grpc_port)},
        dir + "/" + name + ".log");
    INFO(r.process->Log());
    REQUIRE(WaitForStatus(*r.process, http_port, "/health", 200, std::chrono::seconds(60), host));
    return r;
  };
  Replica a = start("127.0.0.2", "replica-a");
  Replica b = start("127.0.0.3", "replica-b");
  const std::string a_http = "127.0.0.2:" + std::to_string(http_port);
  const std::string b_http = "127.0.0.3:" + std::to_string(http_port);
  const std::string a_grpc = "127.0.0.2:" + std::to_string(grpc_port);
  const std::string b_grpc = "127.0.0.3:" + std::to_string(grpc_port);

  const std::string zone = dir + "/zone";
  std::ofstream(zone) << "kvserve-pods.test 127.0.0.2\nkvserve-pods.test 127.0.0.3\n";
  const int dns_port = testing::FreeLoopbackPort();
  ChildProcess dns({"/usr/bin/env", python, SourcePath("tests/deploy/dns_stub.py"),
                    std::to_string(dns_port), zone},
                   dir + "/dns.log");
  {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (dns.Log().find("listening") == std::string::npos && Clock::now() < end &&
           dns.Running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    INFO(dns.Log());
    REQUIRE(dns.Log().find("listening") != std::string::npos);
  }

  // nginx on the dns rendering.
  chmod(dir.c_str(), 0755);
  fs::create_directories(dir + "/temp");
  std::ofstream(dir + "/nginx.conf") << "worker_processes 1;\n"
                                     << "events { worker_connections 512; }\n"
                                     << "http {\n"
                                     << "    client_body_temp_path temp/body;\n"
                                     << "    proxy_temp_path temp/proxy;\n"
                                     << "    include kvserve.conf;\n"
                                     << "}\n";
  Balancer lb;
  lb.http_port = testing::FreeLoopbackPort();
  do {
    lb.grpc_port = testing::FreeLoopbackPort();
  } while (lb.grpc_port == lb.http_port);
  std::string out;
  REQUIRE(testing::RunCommand("bash " + SourcePath("deploy/nginx/render.sh") + " --config " +
                                  SourcePath("configs/default.yaml") +
                                  " --http-listen 127.0.0.1:" + std::to_string(lb.http_port) +
                                  " --grpc-listen 127.0.0.1:" + std::to_string(lb.grpc_port) +
                                  " --access-log " + dir +
                                  "/access.log --resolver 127.0.0.1:" + std::to_string(dns_port) +
                                  " --dns kvserve-pods.test:" + std::to_string(http_port) + ":" +
                                  std::to_string(grpc_port) + " > " + dir + "/kvserve.conf",
                              &out) == 0);
  lb.process = std::make_unique<ChildProcess>(
      std::vector<std::string>{kNginx, "-e", "stderr", "-p", dir + "/", "-c", "nginx.conf", "-g",
                               "daemon off; pid " + dir + "/nginx.pid; error_log stderr;"},
      dir + "/nginx.log");
  {
    INFO(lb.process->Log() << dns.Log());
    REQUIRE(WaitForStatus(*lb.process, lb.http_port, "/health", 200, std::chrono::seconds(20)));
  }

  const std::string body = CompletionBody("Once upon a time", false, false, 32);
  httplib::Client direct_b("127.0.0.3", http_port);
  direct_b.set_read_timeout(60, 0);
  const std::string expected =
      CompletionText(direct_b.Post("/v1/completions", body, "application/json"));
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(lb.grpc_port),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  v1::GenerateRequest grpc_req;
  grpc_req.set_prompt("Once upon a time");
  grpc_req.set_max_tokens(32);
  grpc_req.mutable_sampling()->set_temperature(0);
  // Up to n HTTP and n gRPC requests through nginx: the replicas that served
  // them. With `until_both`, it stops once each kind has reached two.
  auto round = [&](int n, bool until_both = false) {
    std::set<std::string> http, grpc_upstreams;
    for (int i = 0; i < n; ++i) {
      if (until_both && http.size() == 2 && grpc_upstreams.size() == 2) break;
      auto r = LoopbackClient(lb.http_port).Post("/v1/completions", body, "application/json");
      REQUIRE(CompletionText(r) == expected);
      http.insert(r->get_header_value("X-Upstream"));
      LoadRecord g = StreamGrpc(*stub, grpc_req, expected);
      INFO(g.error);
      REQUIRE(g.ok);
      grpc_upstreams.insert(g.upstream);
    }
    return std::make_pair(http, grpc_upstreams);
  };

  // Both addresses of the name serve. nginx takes the peers of a resolved
  // name in the order of its cached answer, which its resolver rotates by a
  // random offset per lookup: six requests all went to one address about one
  // run in thirty (CI saw it), forty do so with odds of 2^-39.
  auto [http1, grpc1] = round(40, true);
  REQUIRE(http1 == std::set<std::string>{a_http, b_http});
  REQUIRE(grpc1 == std::set<std::string>{a_grpc, b_grpc});

  // A leaves the name (a terminating pod leaves the headless Service's DNS
  // during its preStop sleep). Once nginx's answer expires (valid=5s), every
  // request goes to B, although A still runs and would answer.
  std::ofstream(zone) << "kvserve-pods.test 127.0.0.3\n";
  std::this_thread::sleep_for(std::chrono::milliseconds(6500));
  auto [http2, grpc2] = round(6);
  REQUIRE(http2 == std::set<std::string>{b_http});
  REQUIRE(grpc2 == std::set<std::string>{b_grpc});
  REQUIRE(a.process->Running());

  // Then SIGTERM: A drains and exits; B keeps serving.
  a.process->Signal(SIGTERM);
  REQUIRE(a.process->WaitForExit(std::chrono::seconds(60)) == 0);
  auto [http3, grpc3] = round(2);
  REQUIRE(http3 == std::set<std::string>{b_http});
  REQUIRE(grpc3 == std::set<std::string>{b_grpc});

  b.process->Signal(SIGTERM);
  REQUIRE(b.process->WaitForExit(std::chrono::seconds(60)) == 0);
  lb.process->Signal(SIGQUIT);
  REQUIRE(lb.process->WaitForExit(std::chrono::seconds(20)) == 0);
  dns.Signal(SIGTERM);
}

TEST_CASE("Deploy: the shipped nginx config is render.sh's output for Kubernetes",
          "[integration]") {
  std::string rendered;
  REQUIRE(testing::RunCommand(
              "bash " + SourcePath("deploy/nginx/render.sh") + " --config " +
                  SourcePath("deploy/k8s/cpu/configmap.yaml") +
                  " --resolver 10.96.0.10 --dns kvserve-pods.default.svc.cluster.local:8000:50051"
                  " 2>/dev/null",
              &rendered) == 0);
  REQUIRE(rendered == testing::ReadFileOrDie(SourcePath("deploy/nginx/kvserve.conf")));
  // Every placeholder filled (comments may still name them).
  std::istringstream lines(rendered);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    INFO(line);
    REQUIRE(line.find('@') == std::string::npos);
  }
}

// `nginx -t` on a rendering, inside a minimal nginx.conf; the exit code, with
// nginx's messages in *out.
int NginxTest(const std::string& dir, const std::string& render_args, std::string* out) {
  if (!fs::exists(kNginx)) FAIL(kNginx << " is missing (Debian package nginx)");
  WriteNginxConf(dir, 64);
  REQUIRE(testing::RunCommand("bash " + SourcePath("deploy/nginx/render.sh") + " --access-log " +
                                  dir + "/access.log " + render_args + " > " + dir +
                                  "/kvserve.conf",
                              out) == 0);
  return testing::RunCommand(
      std::string(kNginx) + " -t -q -p " + dir + "/ -c nginx.conf -g " +
          testing::ShellQuote("pid " + dir + "/nginx.pid; error_log stderr;") + " 2>&1",
      out);
}

TEST_CASE("Deploy: nginx -t accepts the dns rendering where the replicas' name does not resolve",
          "[integration]") {
  const std::string dir = testing::MakeTempDir("deploy-nginx-t");
  std::string out;
  // dns mode: the name is looked up while running, not by nginx -t.
  {
    INFO(out);
    REQUIRE(NginxTest(
                dir, "--resolver 127.0.0.1:53 --dns kvserve-pods.no-such-domain.invalid:8000:50051",
                &out) == 0);
  }
  const std::string conf = testing::ReadFileOrDie(dir + "/kvserve.conf");
  REQUIRE(conf.find("resolver 127.0.0.1:53 valid=5s ipv6=off;") != std::string::npos);
  REQUIRE(conf.find("set $kvserve_http_upstream kvserve-pods.no-such-domain.invalid:8000;") !=
          std::string::npos);
  REQUIRE(conf.find("set $kvserve_grpc_upstream kvserve-pods.no-such-domain.invalid:50051;") !=
          std::string::npos);
  REQUIRE(conf.find("\nupstream ") == std::string::npos);
  // static mode: upstream blocks resolve their names when nginx starts (the
  // limit of open-source nginx 1.22 that dns mode exists for).
  out.clear();
  REQUIRE(NginxTest(dir, "kvserve-1.no-such-domain.invalid:8000:50051", &out) != 0);
  REQUIRE(out.find("host not found in upstream \"kvserve-1.no-such-domain.invalid:8000\"") !=
          std::string::npos);
}

TEST_CASE("Deploy: render.sh sets client_max_body_size from the replicas' config",
          "[integration]") {
  auto max_body_lines = [](const std::string& args) {
    std::string out;
    const int rc = testing::RunCommand("bash " + SourcePath("deploy/nginx/render.sh") + " " + args +
                                           " 10.0.0.1:8000:50051 2>&1 | grep client_max_body_size",
                                       &out);
    return rc == 0 ? out : "exit " + std::to_string(rc) + ": " + out;
  };
  // The image configs, the Kubernetes ConfigMaps, the daemon's default.
  const std::string mib8 = "    client_max_body_size 8388608;\n    client_max_body_size 8388608;\n";
  const std::string mib32 =
      "    client_max_body_size 33554432;\n    client_max_body_size 33554432;\n";
  REQUIRE(max_body_lines("--config " + SourcePath("deploy/config/cuda.yaml")) == mib32);
  REQUIRE(max_body_lines("--config " + SourcePath("deploy/k8s/cuda/configmap.yaml")) == mib32);
  REQUIRE(max_body_lines("--config " + SourcePath("deploy/config/cpu.yaml")) == mib8);
  REQUIRE(max_body_lines("--config " + SourcePath("configs/default.yaml")) == mib8);
  REQUIRE(max_body_lines("") == mib8);
  REQUIRE(max_body_lines("--max-body 1GB") ==
          "    client_max_body_size 1000000000;\n    client_max_body_size 1000000000;\n");
  REQUIRE(max_body_lines("--max-body 4096") ==
          "    client_max_body_size 4096;\n    client_max_body_size 4096;\n");
  std::string out;
  REQUIRE(testing::RunCommand("bash " + SourcePath("deploy/nginx/render.sh") +
                                  " --max-body 8MiX 10.0.0.1:8000:50051 2>&1",
                              &out) == 2);
  REQUIRE(out == "render.sh: max body size '8MiX' is not a byte size (8MiB, 32MiB, 1000000)\n");
}

// --- deploy/k8s and the container configs ------------------------------------

std::vector<YAML::Node> LoadManifests(const std::string& relative) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAllFromFile(SourcePath(relative));
  } catch (const YAML::Exception& e) {
    FAIL(relative << ": " << e.what());
  }
  REQUIRE(!docs.empty());
  return docs;
}

// The kvserve config inside a ConfigMap manifest, parsed as the daemon would.
ServeConfig ConfigFromConfigMap(const std::string& relative) {
  std::vector<YAML::Node> docs = LoadManifests(relative);
  REQUIRE(docs.size() == 1);
  REQUIRE(docs[0]["kind"].as<std::string>() == "ConfigMap");
  REQUIRE(docs[0]["metadata"]["name"].as<std::string>() == "kvserve-config");
  absl::StatusOr<ServeConfig> config =
      ParseServeConfig(docs[0]["data"]["config.yaml"].as<std::string>(), "");
  INFO(relative << ": " << std::string(config.status().message()));
  REQUIRE(config.ok());
  return *config;
}

int ContainerPort(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& p : container["ports"]) {
    if (p["name"].as<std::string>() == name) return p["containerPort"].as<int>();
  }
  FAIL("no container port named " << name);
  return 0;
}

void CheckDeployment(const std::string& deployment_file, const std::string& configmap_file,
                     bool gpu) {
  INFO(deployment_file);
  const ServeConfig config = ConfigFromConfigMap(configmap_file);
  std::vector<YAML::Node> docs = LoadManifests(deployment_file);
  REQUIRE(docs.size() == 1);
  const YAML::Node& d = docs[0];
  REQUIRE(d["kind"].as<std::string>() == "Deployment");
  const YAML::Node pod = d["spec"]["template"]["spec"];
  const YAML::Node c = pod["containers"][0];
  REQUIRE(c["name"].as<std::string>() == "kvserve");

  REQUIRE(config.server.host == "0.0.0.0");
  REQUIRE(ContainerPort(c, "http") == config.server.http_port);
  REQUIRE(ContainerPort(c, "grpc") == config.server.grpc_port);
  REQUIRE(c["readinessProbe"]["httpGet"]["path"].as<std::string>() == "/health");
  REQUIRE(c["readinessProbe"]["httpGet"]["port"].as<std::string>() == "http");
  REQUIRE(c["livenessProbe"]);

  // Kubernetes kills the pod grace seconds after it starts preStop: preStop
  // plus the daemon's drain must fit, with a margin for the last flush.
  std::vector<std::string> pre_stop =
      c["lifecycle"]["preStop"]["exec"]["command"].as<std::vector<std::string>>();
  REQUIRE(pre_stop.size() == 2);
  REQUIRE(pre_stop[0] == "sleep");
  const double pre_stop_s = std::stod(pre_stop[1]);
  const double grace_s = pod["terminationGracePeriodSeconds"].as<double>();
  REQUIRE(grace_s >= pre_stop_s + config.server.shutdown_timeout + 5);

  // The config arrives where the image's ENTRYPOINT reads it; the model is a volume.
  std::map<std::string, std::string> mounts;
  for (const YAML::Node& m : c["volumeMounts"]) {
    mounts[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
  }
  REQUIRE(mounts["config"] == "/etc/kvserve");
  REQUIRE(mounts["models"] == "/models");
  REQUIRE(config.model.path.rfind("/models", 0) == 0);
  bool config_volume = false, model_volume = false;
  for (const YAML::Node& v : pod["volumes"]) {
    const std::string name = v["name"].as<std::string>();
    if (name == "config")
      config_volume = v["configMap"]["name"].as<std::string>() == "kvserve-config";
    if (name == "models") {
      model_volume = v["persistentVolumeClaim"]["claimName"].as<std::string>() == "kvserve-models";
    }
  }
  REQUIRE(config_volume);
  REQUIRE(model_volume);
  REQUIRE(pod["securityContext"]["runAsUser"].as<int>() == 10001);  // the image's user

  REQUIRE(config.model.device == (gpu ? "cuda" : "cpu"));
  if (gpu) {
    REQUIRE(c["resources"]["limits"]["nvidia.com/gpu"].as<int>() == 1);
  } else {
    REQUIRE(!c["resources"]["limits"]["nvidia.com/gpu"]);
  }

  // The Services select these pods and name their ports.
  std::vector<YAML::Node> services = LoadManifests("deploy/k8s/base/service.yaml");
  REQUIRE(services.size() == 2);
  const YAML::Node labels = d["spec"]["template"]["metadata"]["labels"];
  for (const YAML::Node& s : services) {
    REQUIRE(s["kind"].as<std::string>() == "Service");
    for (const auto& kv : s["spec"]["selector"]) {
      REQUIRE(labels[kv.first.as<std::string>()].as<std::string>() == kv.second.as<std::string>());
    }
    std::set<std::string> targets;
    for (const YAML::Node& p : s["spec"]["ports"])
      targets.insert(p["targetPort"].as<std::string>());
    REQUIRE(targets == std::set<std::string>{"http", "grpc"});
  }
}

TEST_CASE("Deploy: the Kubernetes manifests parse and agree with the daemon's config",
          "[integration]") {
  SECTION("the CPU Deployment with its ConfigMap") {
    CheckDeployment("deploy/k8s/cpu/deployment.yaml", "deploy/k8s/cpu/configmap.yaml", false);
  }
  SECTION("the CUDA Deployment with its ConfigMap") {
    CheckDeployment("deploy/k8s/cuda/deployment.yaml", "deploy/k8s/cuda/configmap.yaml", true);
  }
  SECTION("the model volume claim") {
    std::vector<YAML::Node> docs = LoadManifests("deploy/k8s/base/pvc.yaml");
    REQUIRE(docs.size() == 1);
    REQUIRE(docs[0]["kind"].as<std::string>() == "PersistentVolumeClaim");
    REQUIRE(docs[0]["metadata"]["name"].as<std::string>() == "kvserve-models");
  }
  SECTION("the images' built-in configs") {
    for (const std::string variant : {"cpu", "cuda"}) {
      INFO(variant);
      absl::StatusOr<ServeConfig> config =
          ParseServeConfig(testing::ReadFileOrDie(SourcePath("deploy/config/" + variant + ".yaml")),
                           "", {"server.http_port=8000", "server.grpc_port=50051"});
      INFO(std::string(config.status().message()));
      REQUIRE(config.ok());
      REQUIRE(config->server.host == "0.0.0.0");
      const std::string dockerfile =
          testing::ReadFileOrDie(SourcePath("deploy/Dockerfile." + variant));
      REQUIRE(dockerfile.find("COPY deploy/config/" + variant + ".yaml /etc/kvserve/config.yaml") !=
              std::string::npos);
      REQUIRE(dockerfile.find("EXPOSE 8000 50051") != std::string::npos);
      REQUIRE(dockerfile.find(
                  R"(ENTRYPOINT ["kvserve", "serve", "--config", "/etc/kvserve/config.yaml"])") !=
              std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kvserve
