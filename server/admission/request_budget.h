// The front ends' side of the request cost budget (the limits and checks are
// scheduler/request_validation.h): prompt tokenization held to the budget,
// and the worker threads it runs on.
//
// TokenizeWithinBudget refuses a prompt over limits.max_prompt_bytes before
// tokenizing it, so the work it does is bounded by that limit (about 1 us a
// byte for SentencePiece), and a prompt over limits.max_prompt_tokens right
// after. Front ends send the engine token ids, so the engine never tokenizes
// a request's text on the thread that called Submit.
//
// PromptWorkers: a few threads on which the front ends parse, tokenize and
// submit, so gRPC's callback threads and the HTTP io threads (which every
// other call needs) never tokenize. The daemon gives both front ends one
// pool; each reaches it through a PromptClient, which counts the work it
// queued so that the front end can stop (PromptClient::Drain) before the
// pool does. Work runs in FIFO order; Stop() runs what is queued, then joins.
//
// Thread-safety: TokenizeWithinBudget is a pure function; PromptWorkers' and
// PromptClient's methods are safe from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/request_validation.h"

namespace kvserve {

// Token ids of a text prompt, or an InvalidArgument naming `field` when it is
// over the byte or token budget.
absl::StatusOr<std::vector<int32_t>> TokenizeWithinBudget(const Tokenizer& tokenizer,
                                                          std::string_view text, bool add_bos,
                                                          const RequestLimits& limits,
                                                          std::string_view field = "prompt");

class PromptWorkers {
 public:
  explicit PromptWorkers(int threads);
  ~PromptWorkers();  // Stop()
  PromptWorkers(const PromptWorkers&) = delete;
  PromptWorkers& operator=(const PromptWorkers&) = delete;

  // Queues `work`; after Stop() it runs on the calling thread.
  void Run(std::function<void()> work);
  // Runs the queued work and joins the threads.
  void Stop();

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// One front end's share of a PromptWorkers pool: the pool it was given
// (shared with the other front end), or one of its own of `threads` when
// given none.
class PromptClient {
 public:
  PromptClient(std::shared_ptr<PromptWorkers> shared, int threads);
  ~PromptClient();  // Drain()
  PromptClient(const PromptClient&) = delete;
  PromptClient& operator=(const PromptClient&) = delete;

  // Queues `work` on the pool (after the pool's Stop, runs it inline).
  void Run(std::function<void()> work);
  // Waits until every work this client queued has run; then stops the pool
  // when it is the client's own.
  void Drain();
  bool shared() const { return !own_; }

 private:
  std::shared_ptr<PromptWorkers> pool_;
  bool own_ = false;
  absl::Mutex mu_;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvserve
