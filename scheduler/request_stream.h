// RequestStream: the thread-safe hand-off of one request's outputs from the
// engine thread to a front end, and of cancellation back. The engine pushes
// outputs and finally Close()s; the front end pops them (blocking, or polling
// after a notification) and may Cancel() at any time (client gone). A
// cancelled request's blocks are freed by the engine's next step.
//
// Thread-safety: every method is safe from any thread. The notify callback
// runs on the engine thread and must not block.
//
// Example (blocking front end):
//   GenerateOutput out;
//   while (stream->Next(&out) == RequestStream::Pop::kOutput) Send(out);
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/request.h"

namespace kvserve {

class RequestStream {
 public:
  explicit RequestStream(std::string request_id) : request_id_(std::move(request_id)) {}

  const std::string& request_id() const { return request_id_; }

  enum class Pop { kOutput, kEnd, kTimeout };
  // Waits for the next output; kEnd once closed and drained.
  Pop Next(GenerateOutput* out, absl::Duration timeout = absl::InfiniteDuration());
  // Non-blocking: kTimeout when nothing is ready yet.
  Pop TryNext(GenerateOutput* out) { return Next(out, absl::ZeroDuration()); }
  // Called whenever an output is pushed or the stream closes (engine thread).
  // Set it before the first output can arrive, or poll once after setting.
  void SetNotify(std::function<void()> notify);

  // Front end: the client is gone or asked to stop.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // Waits until Cancel() or `timeout`; true when cancelled. For a producer
  // that pauses between outputs and must stop the moment the client goes.
  bool AwaitCancelled(absl::Duration timeout) const;

  // Engine side.
  void Push(GenerateOutput out);
  void Close();
  bool closed() const;

 private:
  const std::string request_id_;
  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex mu_;
  std::deque<GenerateOutput> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> notify_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve
