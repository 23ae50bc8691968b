// Scheduler: the continuous-batching policy. Each step it decides which
// sequences run and how many of their tokens (a StepPlan), reserving their
// KV slots in the KvCacheManager as it goes.
//
// Policy (vLLM v1-like, one token budget per step):
//   1. Running sequences, in service order (ServedBefore), each get their
//      next tokens: one decode token, or the next chunk of a prefill or
//      recompute, up to the remaining budget. When the pool cannot hold a
//      sequence's new slot, the last running sequence in service order (lowest
//      priority, latest arrival, highest sample index) is preempted, until
//      the slot fits or the sequence itself was the one preempted.
//   2. If nothing was preempted in 1., swapped sequences are resumed in
//      service order while blocks and max_num_seqs allow.
//   0. With per-client fairness (SchedulerConfig::fair_clients), while the
//      next waiting sequence is of another client, served before the last
//      running one (a lower client rank: clients take turns) and does not
//      fit (sequence slots or blocks), the last running one is preempted by
//      recompute. One client's many requests then delay another's by about
//      one step, not by the length of its queue.
//   3. If nothing was preempted in 1. and no sequence is still swapped, waiting
//      sequences are admitted in service order (strictly: the first that does
//      not fit stops admission, so a large request is never overtaken
//      forever) while max_num_seqs, the token budget and blocks allow. A
//      prompt larger than the remaining budget is admitted with a first chunk
//      (chunked prefill); all its slots are reserved at admission.
// Preemption modes: kSwap moves the victim's blocks to the host pool
// (KvCacheManager::SwapOut) and falls back to recompute when the host pool is
// full; kRecompute frees them and puts the victim back into the waiting
// queue, where service order places it ahead of every later arrival (the
// front, under FCFS). A recomputed sequence re-runs prompt + generated tokens
// (reusing whatever the prefix cache still holds) and then continues
// sampling where it stopped.
//
// Evicting sequences (Sequence::evictor) reserve only what their next step
// computes, in steps SequenceEvictor::StepRows sizes (capped at
// max_num_batched_tokens): a prompt in chunks that keep the cache within the
// hold limit, then one token per step. A sequence whose step does not fit
// the remaining budget waits for the next step rather than taking fewer
// rows, so its tokens never depend on what it is batched with. Policies that
// rank entries by attention skip the prefix cache (a cached prefix would
// skip the rows whose attention they count).
//
// Every sequence the engine submits must fit the whole pool alone (the engine
// checks at Submit), so the first sequence in service order always makes
// progress and nothing is retried forever.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "scheduler/engine_config.h"
#include "scheduler/sequence.h"

namespace kvserve {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 512;
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  // Per-client fairness: a waiting sequence of another client that is
  // served before the last running one but does not fit takes its place
  // (the victim is recomputed, never swapped: a swapped sequence would hold
  // admission back).
  bool fair_clients = false;
};

struct ScheduledSeq {
  Sequence* seq;
  int32_t num_new_tokens;  // rows of this step: tokens [num_computed, num_computed + this)
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;  // batch order
  int32_t num_tokens = 0;
  int32_t num_preempted = 0;

  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv);

  // A new request's first sample, or a sample to re-admit.
  void AddWaiting(Sequence* seq);
  // A freshly forked sample whose parent is running (its blocks are shared).
  void AddRunning(Sequence* seq);
  // Takes a sequence out of whichever queue holds it and frees its blocks.
  void Remove(Sequence* seq);
  // Preempts a running sequence outside Schedule (an eviction that could not
  // copy a shared block), as Schedule would.
  void PreemptRunning(Sequence* seq) { Preempt(seq); }

  // Plans the next step; the plan stays valid until the next call.
  const StepPlan& Schedule();

  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_swapped() const { return static_cast<int32_t>(swapped_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  bool idle() const { return waiting_.empty() && running_.empty() && swapped_.empty(); }
  // The next waiting sequence in service order (nullptr when none).
  Sequence* next_waiting() const { return waiting_.empty() ? nullptr : waiting_.front(); }
  Sequence* next_swapped() const { return swapped_.empty() ? nullptr : swapped_.front(); }

 private:
  // Reserves slots for tokens sampled since the last step, preempting as
  // needed. Returns false when `seq` itself had to be preempted.
  bool ReserveDecodeSlots(Sequence* seq);
  // An evicting sequence's rows for this step (SequenceEvictor::StepRows).
  int32_t EvictingRows(const Sequence* seq) const;
  // Reserves slots so that `rows` rows from num_computed have them,
  // preempting as needed. Returns false when `seq` itself was preempted.
  bool ReserveRows(Sequence* seq, int32_t rows);
  // may_swap false: recompute whatever the mode (fairness preemption).
  void Preempt(Sequence* victim, bool may_swap = true);
  // Fairness: preempts running sequences that the next waiting one of
  // another client is served before, until it fits. Returns how many.
  int32_t PreemptForWaiting();
  // What admission reserves for `seq`: its first step when evicting, else all
  // its tokens.
  std::span<const int32_t> AdmissionTokens(const Sequence* seq) const;
  int32_t PromisedSlots() const;
  void InsertSorted(std::deque<Sequence*>& queue, Sequence* seq);
  void InsertRunning(Sequence* seq);
  void Plan(Sequence* seq, int32_t num_new);

  SchedulerConfig config_;
  KvCacheManager* kv_;
  std::deque<Sequence*> waiting_;   // service order
  std::vector<Sequence*> running_;  // service order
  std::deque<Sequence*> swapped_;   // service order
  StepPlan plan_;
  int32_t budget_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace kvserve
