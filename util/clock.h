// Clock: where code that measures or compares times reads "now", so tests can
// inject time instead of sleeping. RealClock() is absl::Now(); SimulatedClock
// moves only when a test says so (AdvanceTime/SetTime).
//
// Example (a test):
//   auto clock = std::make_shared<SimulatedClock>();
//   config.clock = clock;                       // EngineConfig
//   ... engine->Drain(clock->Now() + absl::Seconds(5)) on another thread ...
//   clock->AdvanceTime(absl::Seconds(5));       // the deadline has now passed
//
// Thread-safety: Now() may be called from any thread; a SimulatedClock may be
// advanced from any thread.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvserve {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The process-wide real clock (absl::Now()); never null, never destroyed.
std::shared_ptr<const Clock> RealClock();

class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void AdvanceTime(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void SetTime(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve
