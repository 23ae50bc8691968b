// PromptWorkers at shutdown: Stop() runs every prompt already queued (in
// order) before it joins, so no queued request is dropped without an answer,
// and work handed in after Stop() runs on the caller's thread.
#include "server/admission/request_budget.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace kvserve {
namespace {

TEST_CASE("PromptWorkers::Stop runs every queued prompt in order before it returns", "[server]") {
  PromptWorkers workers(1);
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification started, release;
  workers.Run([&] {
    started.Notify();
    release.WaitForNotification();
    absl::MutexLock lock(&mu);
    order.push_back(0);
  });
  started.WaitForNotification();  // the one worker is busy: the rest queue up
  for (int i = 1; i <= 50; ++i) {
    workers.Run([&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    });
  }
  std::thread stopper([&] { workers.Stop(); });
  // Stop has begun once work handed in runs right here, on this thread;
  // probes handed in before that are queued and must run too.
  const std::thread::id here = std::this_thread::get_id();
  std::atomic<int> queued_probes_run{0};
  int probes_queued = 0;
  for (;;) {
    bool ran_here = false;
    workers.Run([&] {
      if (std::this_thread::get_id() == here) {
        ran_here = true;
      } else {
        queued_probes_run.fetch_add(1);
      }
    });
    if (ran_here) break;
    ++probes_queued;
    std::this_thread::yield();
  }
  release.Notify();
  stopper.join();
  std::vector<int> expected;
  for (int i = 0; i <= 50; ++i) expected.push_back(i);
  absl::MutexLock lock(&mu);
  REQUIRE(order == expected);
  REQUIRE(queued_probes_run.load() == probes_queued);
}

TEST_CASE("PromptWorkers after Stop runs work on the calling thread", "[server]") {
  PromptWorkers workers(2);
  workers.Stop();
  std::thread::id ran_on;
  workers.Run([&] { ran_on = std::this_thread::get_id(); });
  REQUIRE(ran_on == std::this_thread::get_id());
  workers.Stop();  // idempotent
}

TEST_CASE("Two PromptClients on one pool: each drains its own work, the pool runs on", "[server]") {
  auto pool = std::make_shared<PromptWorkers>(1);
  PromptClient http(pool, 4);
  PromptClient grpc(pool, 2);
  REQUIRE(http.shared());
  REQUIRE(grpc.shared());
  absl::Notification release;
  std::atomic<int> http_done{0};
  std::atomic<bool> grpc_done{false};
  // The pool's one thread is held by gRPC's work; HTTP's queues behind it.
  grpc.Run([&] {
    release.WaitForNotification();
    grpc_done = true;
  });
  for (int i = 0; i < 3; ++i) http.Run([&] { ++http_done; });
  // A throwing work still counts as done (the pool's loop catches it).
  http.Run([] { throw std::runtime_error("a bug"); });
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    release.Notify();
  });
  http.Drain();
  // HTTP's Drain waited for its four works, so for gRPC's ahead of them.
  REQUIRE(http_done.load() == 3);
  REQUIRE(grpc_done.load());
  releaser.join();
  grpc.Drain();
  // Neither client stopped the shared pool: it still runs work on its thread.
  std::thread::id ran_on;
  absl::Notification ran;
  pool->Run([&] {
    ran_on = std::this_thread::get_id();
    ran.Notify();
  });
  ran.WaitForNotification();
  REQUIRE(ran_on != std::this_thread::get_id());
}

TEST_CASE("A PromptClient without a pool stops its own when drained", "[server]") {
  PromptClient own(nullptr, 2);
  REQUIRE_FALSE(own.shared());
  std::atomic<int> done{0};
  for (int i = 0; i < 10; ++i) own.Run([&] { ++done; });
  own.Drain();
  REQUIRE(done.load() == 10);
  // Stopped: work runs on the caller.
  std::thread::id ran_on;
  own.Run([&] { ran_on = std::this_thread::get_id(); });
  REQUIRE(ran_on == std::this_thread::get_id());
}

}  // namespace
}  // namespace kvserve
