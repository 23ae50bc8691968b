#include "server/admission/engine_gate.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

namespace kvserve {
namespace {

TEST_CASE("EngineGate: leases until closed, and Close waits for the last one", "[server]") {
  EngineGate gate;
  EngineGate::Lease a = gate.Enter();
  EngineGate::Lease b = gate.Enter();
  REQUIRE(a.held());
  REQUIRE(b.held());
  b.Release();
  REQUIRE_FALSE(b.held());

  std::atomic<bool> released{false};
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    released = true;
    a.Release();
  });
  REQUIRE(gate.Close(absl::Now() + absl::Seconds(20)));
  // Close returned only once the lease was given back.
  REQUIRE(released.load());
  holder.join();
  REQUIRE(gate.closed());
  REQUIRE_FALSE(gate.Enter().held());
  // A moved lease is released once, by its new owner.
  EngineGate other;
  EngineGate::Lease c = other.Enter();
  EngineGate::Lease d = std::move(c);
  REQUIRE_FALSE(c.held());
  REQUIRE(d.held());
  d = EngineGate::Lease();
  REQUIRE(other.Close(absl::Now()));
}

// A call that holds its lease until cancelled, as a gRPC stream does.
struct HeldCall final : EngineGate::Cancellable {
  EngineGate::Lease lease;
  std::atomic<int> cancels{0};
  void Cancel() override {
    ++cancels;
    lease.Release();
  }
};

TEST_CASE("EngineGate: calls still holding a lease at the deadline are cancelled", "[server]") {
  EngineGate gate;
  auto held = std::make_shared<HeldCall>();
  held->lease = gate.Enter();
  gate.Track(held);
  {
    // A call that ended before Close is not cancelled.
    auto gone = std::make_shared<HeldCall>();
    gate.Track(gone);
  }
  const absl::Time start = absl::Now();
  REQUIRE(gate.Close(absl::Now() + absl::Milliseconds(200)));
  REQUIRE(absl::Now() - start >= absl::Milliseconds(200));
  REQUIRE(held->cancels.load() == 1);
  REQUIRE_FALSE(held->lease.held());
}

}  // namespace
}  // namespace kvserve
