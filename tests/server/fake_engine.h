// FakeEngine: an Engine for front-end tests. Each request gets a thread that
// streams the reply "abcdefghijklmnopqrstuvwxyz..." one byte-level token
// per output (token id 3 + byte) until max_tokens (finish "length") or the
// configured reply length (finish "stop"), or until the stream is cancelled.
// Knobs make Submit fail the way the real engine does.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "scheduler/engine.h"
#include "util/field_status.h"

namespace kvserve::testing {

class FakeEngine final : public Engine {
 public:
  FakeEngine() : tokenizer_(Tokenizer::ByteLevel(512)) {
    model_.name = "fake";
    model_.architecture = "LlamaForCausalLM";
    model_.vocab_size = 512;
    model_.max_position_embeddings = 256;
    model_.num_layers = 1;
  }
  ~FakeEngine() override {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  // Replies stop after this many tokens ("stop"); max_tokens may end them first.
  int reply_length = 26;
  bool queue_full = false;
  // Pause between tokens, so a client can leave while a reply is running; a
  // cancel ends the pause at once (RequestStream::AwaitCancelled).
  absl::Duration token_interval = absl::ZeroDuration();

  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest request) override {
    if (draining_) return absl::UnavailableError("draining");
    if (queue_full) return absl::ResourceExhaustedError("queue full (1 waiting)");
    if (request.max_tokens == 77) return FieldError("max_tokens", "max_tokens (77) is cursed");
    auto stream = std::make_shared<RequestStream>(request.request_id);
    absl::MutexLock lock(&mu_);
    last_request_ = request;
    ++submitted_;
    threads_.emplace_back([this, stream, request] { Run(stream, request); });
    return stream;
  }

  EngineStats GetStats() const override {
    absl::MutexLock lock(&mu_);
    EngineStats s;
    s.num_running = running_;
    s.requests_finished_cancelled = cancelled_;
    s.kv.active_usage = running_ > 0 ? 0.5 : 0.0;
    return s;
  }
  void Drain(absl::Time deadline) override {
    draining_ = true;
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
    mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  }
  bool draining() const override { return draining_; }
  const ModelConfig& model_config() const override { return model_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const EngineConfig& config() const override { return config_; }

  GenerateRequest last_request() const {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }
  // Waits (bounded) until `n` requests were cancelled; returns the count.
  int WaitForCancelled(int n, absl::Duration timeout = absl::Seconds(10)) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return cancelled_;
  }
  int WaitForIdle(absl::Duration timeout = absl::Seconds(10)) const {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
    return running_;
  }

 private:
  void Run(std::shared_ptr<RequestStream> stream, GenerateRequest request) {
    {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    int generated = 0;
    bool cancelled = false;
    for (int32_t index = 0; index < request.n && !cancelled; ++index) {
      for (int i = 0;; ++i) {
        if (stream->cancelled()) {
          cancelled = true;
          break;
        }
        GenerateOutput out;
        out.index = index;
        const char c = static_cast<char>('a' + i % 26);
        out.text = std::string(1, c);
        out.token_ids = {3 + static_cast<unsigned char>(c)};
        if (request.logprobs >= 0) {
          out.logprobs = {{out.token_ids[0], -0.25f, {}}};
          for (int k = 0; k < request.logprobs; ++k) {
            out.logprobs[0].top.push_back({3 + 'a' + k, -1.0f * static_cast<float>(k)});
          }
        }
        ++generated;
        const bool last = i + 1 >= reply_length || i + 1 >= request.max_tokens;
        if (last) {
          out.finish_reason = i + 1 >= reply_length ? FinishReason::kStop : FinishReason::kLength;
          if (index + 1 == request.n) {
            out.request_finished = true;
            out.usage.prompt_tokens = static_cast<int32_t>(request.prompt_token_ids.size());
            out.usage.completion_tokens = generated;
          }
        }
        stream->Push(std::move(out));
        if (last) break;
        if (token_interval > absl::ZeroDuration()) stream->AwaitCancelled(token_interval);
      }
    }
    if (cancelled) {
      GenerateOutput out;
      out.finish_reason = FinishReason::kCancelled;
      out.request_finished = true;
      stream->Push(std::move(out));
    }
    stream->Close();
    absl::MutexLock lock(&mu_);
    --running_;
    if (cancelled) ++cancelled_;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  ModelConfig model_;
  EngineConfig config_;
  std::atomic<bool> draining_{false};
  mutable absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  GenerateRequest last_request_ ABSL_GUARDED_BY(mu_);
  int submitted_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvserve::testing
