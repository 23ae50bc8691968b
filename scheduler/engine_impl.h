// EngineImpl: the Engine (engine.h) behind Engine::Create. One thread runs
// the loop below; Submit/GetStats/Drain talk to it through a mutex-guarded
// inbox and a published stats snapshot. engine_impl.cc holds creation,
// validation, submission and the loop; engine_step.cc the step (steps 3-6).
//
// One step of the loop:
//   1. take new submissions, cancel requests whose stream was cancelled
//      (their blocks are freed before anything is scheduled);
//   2. Scheduler::Schedule() -> StepPlan (preempting when the pool is short);
//   3. run the KV copies the plan recorded (swap-out, copy-on-write,
//      swap-in) through the ModelRunner, before the forward pass;
//   4. build the BatchInput (buffers reused, no per-step allocation once
//      warm) and run Forward (the logits stay in the runner);
//   5. for rows that complete a sequence's uncomputed tokens: fork n > 1
//      requests and collect one SampleRow per sample (the n samples of a
//      fresh fork share their prompt's logits row); one ModelRunner::Sample
//      call draws them all where the logits are (on the GPU for CUDA);
//      then, in plan order, emit, detokenize, match stops, finish and free;
//   6. publish the stats snapshot, then push this step's events (so a client
//      that sees an event sees stats at least as new as its step).
// When there is nothing to do the thread sleeps on the mutex until a
// submission or shutdown arrives. Times (request metrics, Drain's deadline)
// come from EngineConfig::clock: once draining, each loop iteration cancels
// what is left if the clock has passed the deadline.
//
// Request semantics worth knowing:
//   * Stop tokens (EOS and, for llama2.c stories checkpoints, BOS, unless
//     ignore_eos; plus stop_token_ids) are reported in token_ids and counted
//     in completion_tokens, but add no text. A stop string is matched on the
//     text (sequence.h, stop_matcher.h); the token that completes it is
//     reported, the stop string and anything after it are not.
//   * Sample i of an n > 1 request draws from seed (seed + i) mod 2^64
//     (sequence.h), so it equals a separate request with that seed.
//   * Limits checked at Submit: n <= min(64, max_num_seqs); logprobs in
//     [-1, 20]; prompt (text + BOS, or prompt_token_ids as given) non-empty
//     and inside the vocabulary; prompt + max_tokens <= max_model_len and
//     within the whole KV pool; kv_policy valid (errors name kv_policy.*).
//   * KV eviction (cache/eviction/eviction_policy.h), per request: an evicting
//     sequence is stepped as Scheduler documents; after each step's forward
//     pass its evictor observes the step (attention statistics when the
//     policy ranks by them), and after sampling it drops what exceeds its
//     budget (KvCacheManager::Evict); the copies and slot moves run at once.
//     An eviction that must copy a shared block with the pool full preempts
//     the sequence. streaming and sliding_window keep every relative
//     position within the budget, so they are not held to max_model_len;
//     the other policies are.
//   * Every event of a request carries one sample's new tokens for one step;
//     a sample's last event has its finish_reason; the request's very last
//     event has request_finished and usage. Samples of an n > 1 request that
//     ends before its fork (cancelled while prefilling) still get a final
//     event each.
//
// Thread-safety: as Engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cache/eviction/learned_evictor.h"
#include "cache/kv_cache_manager.h"
#include "kernels/batch_input.h"
#include "model/model_runner.h"
#include "scheduler/engine.h"
#include "scheduler/engine_tiers.h"
#include "scheduler/scheduler.h"
#include "scheduler/sequence.h"
#include "scheduler/tier_prefetch.h"

namespace kvserve {

class EngineImpl final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<EngineImpl>> Create(
      const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
      std::shared_ptr<const Tokenizer> tokenizer);
  ~EngineImpl() override;

  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest request) override;
  EngineStats GetStats() const override;
  void Drain(absl::Time deadline) override;
  bool draining() const override { return draining_.load(std::memory_order_acquire); }

  const ModelConfig& model_config() const override { return model_config_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const EngineConfig& config() const override { return config_; }

 private:
  EngineImpl(const EngineConfig& config, int32_t max_model_len, std::unique_ptr<ModelRunner> runner,
             std::shared_ptr<const Tokenizer> tokenizer, const KvCacheConfig& kv_config,
             const EvictionParams& eviction, std::shared_ptr<const EvictorModel> evictor_model,
             std::unique_ptr<EngineTiers> tiers);

  // Submit's checks; fills req->prompt_ids and the request's eviction.
  // InvalidArgument names the field.
  absl::Status Validate(GenerateRequest& request, RequestState* req) const;
  // The request's eviction: the engine's defaults with its overrides.
  absl::Status ResolveEviction(const KvPolicyOverride& o, RequestState* req) const;

  // ---- Engine thread ----
  void Loop();
  void Admit(std::unique_ptr<RequestState> req);
  void CancelRequests(bool all);
  void Step();
  void BuildBatch(const StepPlan& plan);
  // After the forward pass: evicting sequences observe the step.
  absl::Status ObserveStep(const StepPlan& plan);
  // After sampling: evictions, then their copies and slot moves.
  void EvictAfterStep();
  absl::Status RunCopies();
  void FailRequests(const std::vector<const Sequence*>& seqs, const std::string& error);
  // Adds the SampleRows of a sequence whose prompt or decode row is done
  // (forking an n > 1 request first); logits_index is its logits row.
  void AddSampleRows(Sequence* seq, int32_t logits_index);
  void AddSampleRow(Sequence* seq, int32_t logits_index);
  void Fork(Sequence* parent);
  void EmitToken(Sequence* seq, int32_t token, float logprob,
                 std::vector<std::pair<int32_t, float>>* top);
  // Feeds an emitted (non-stop) token to the sequence's grammar: kEnd when
  // the grammar must end there (the sample stops at once).
  enum class GrammarStep { kGoOn, kEnd, kRejected };
  GrammarStep AdvanceGrammar(Sequence* seq, int32_t token);
  void FinishSample(Sequence* seq, FinishReason reason, bool flush_text,
                    const std::string& error = "");
  void FinishRequest(RequestState* req, FinishReason reason, const std::string& error = "");
  void Touch(RequestState* req);
  void FlushEvents();
  void PublishStats();

  const EngineConfig config_;
  const std::shared_ptr<const Clock> clock_;  // config_.clock or RealClock()
  const int32_t max_model_len_;
  const ModelConfig model_config_;
  std::unique_ptr<ModelRunner> runner_;
  const std::shared_ptr<const Tokenizer> tokenizer_;
  const int32_t vocab_size_;
  const int32_t block_size_;
  const int32_t num_blocks_;
  mutable EngineGrammars grammars_;        // compiles constraints at Submit
  const EvictionParams default_eviction_;  // budget resolved against the model
  // One shared policy per kind (null: none, or learned without a model).
  std::vector<std::shared_ptr<const EvictionPolicy>> policies_;
  SubmitBounds bounds_;  // what Submit checks a request against (set once)

  // Engine thread only.
  std::unique_ptr<EngineTiers> tiers_;  // null: no tier below the device
  KvCacheManager kv_;
  std::unique_ptr<TierPrefetch> prefetch_;  // with a disk or remote tier
  std::vector<Sequence*> ready_;            // scratch: prefetched this iteration
  Scheduler scheduler_;
  BatchInput batch_;
  std::vector<SampleRow> sample_rows_;    // this step's draws
  std::vector<Sequence*> sample_seqs_;    // the sample of each row
  std::vector<SampledToken> sampled_;     // capacity (and top vectors) reused
  std::vector<float> attn_stats_;         // this step's ReadAttentionStats
  std::vector<int64_t> stats_offset_;     // [plan seqs]: into attn_stats_, or -1
  std::vector<int32_t> evict_positions_;  // scratch
  std::vector<Sequence*> evicting_;       // to evict after this step's sampling
  // Constrained rows whose grammar allows no token this step.
  std::vector<Sequence*> grammar_dead_;
  std::string piece_scratch_;
  std::vector<std::unique_ptr<RequestState>> live_;
  // With fair_clients: live requests per GenerateRequest::client.
  absl::flat_hash_map<std::string, int32_t> live_per_client_;
  std::vector<RequestState*> touched_;  // requests with events this step
  std::vector<std::unique_ptr<RequestState>> incoming_;
  SeqId next_seq_id_ = 1;
  absl::Time step_time_;
  EngineStats stats_;  // counters and gauges, published each step

  // Shared with front ends.
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<RequestState>> inbox_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Drain's deadline on clock_: the loop cancels what is left once it passes.
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool idle_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 seed_rng_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> num_waiting_{0};  // waiting queue and tier loads, per step
  std::atomic<int64_t> rejected_{0};
  std::atomic<bool> draining_{false};

  mutable absl::Mutex stats_mu_;
  EngineStats published_ ABSL_GUARDED_BY(stats_mu_);

  std::thread thread_;
};

}  // namespace kvserve
