// EngineGate: the one drain gate of both front ends. It counts the calls
// and handlers that may touch the engine (its tokenizer, its streams), so
// the daemon can wait until none does before it destroys the engine. Every
// HTTP handler and gRPC call that uses the engine holds a Lease for as long
// as it does; once Close is called no Lease is given out, and the front ends
// answer 503 / UNAVAILABLE on ports that stay open. ServingState owns the
// daemon's gate (server/serving_state.h).
//
// Calls that hold a lease for long (a gRPC Generate streams until its
// sequence ends) register a Cancellable with Track; those still holding one
// at Close's deadline are cancelled, so Close returns soon after it.
//
// Thread-safety: every method is safe from any thread; a Lease is moved,
// not shared.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvserve {

class EngineGate {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        Release();
        gate_ = std::exchange(o.gate_, nullptr);
      }
      return *this;
    }
    ~Lease() { Release(); }
    void Release() {
      if (gate_ != nullptr) std::exchange(gate_, nullptr)->Leave();
    }
    bool held() const { return gate_ != nullptr; }

   private:
    friend class EngineGate;
    explicit Lease(EngineGate* gate) : gate_(gate) {}
    EngineGate* gate_ = nullptr;
  };

  // What Close cancels when it still holds a lease at the deadline.
  class Cancellable {
   public:
    virtual ~Cancellable() = default;
    virtual void Cancel() = 0;
  };

  EngineGate() = default;
  EngineGate(const EngineGate&) = delete;
  EngineGate& operator=(const EngineGate&) = delete;

  // A lease, or an empty one once closed.
  Lease Enter();
  // Remembers `call` (weakly) so that Close can cancel it at its deadline.
  void Track(std::weak_ptr<Cancellable> call);
  // Closes the gate and waits until no lease is held; calls still holding
  // one at `deadline` are cancelled and waited for, a few more seconds.
  // False if some lease is still held then. Calling it again waits again.
  bool Close(absl::Time deadline);
  bool closed() const;

 private:
  void Leave();
  bool WaitIdle(absl::Time deadline);

  mutable absl::Mutex mu_;
  int64_t users_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<Cancellable>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve
