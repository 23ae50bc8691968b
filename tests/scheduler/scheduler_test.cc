// The Scheduler alone, on a tiny pool with hand-made sequences: exact step
// plans (chunked prefill, admission order, budgets), exact preemption victims
// in both modes, priorities and strict first-come-first-served admission.
// The engine's part of a step (running the model, sampling) is played by
// Complete(): every planned row is computed, and a sequence whose tokens are
// all computed gets one more sampled token.
#include "scheduler/scheduler.h"

#include <catch2/catch.hpp>
#include <memory>
#include <utility>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace kvserve {
namespace {

class Fixture {
 public:
  Fixture(int32_t num_blocks, int32_t budget, int32_t max_num_seqs, PreemptionMode mode,
          int32_t num_swap_blocks = 0)
      : tokenizer_(Tokenizer::ByteLevel(512)),
        kv_(KvCacheConfig{/*block_size=*/4, num_blocks, num_swap_blocks,
                          /*enable_prefix_caching=*/false}),
        scheduler_(SchedulerConfig{max_num_seqs, budget, mode}, &kv_) {}

  // A one-sample request of `prompt_len` tokens, queued as waiting.
  Sequence* Submit(int32_t prompt_len, int32_t priority = 0) {
    auto req = std::make_unique<RequestState>();
    req->arrival = next_arrival_++;
    req->params.priority = priority;
    req->params.n = 1;
    for (int32_t i = 0; i < prompt_len; ++i) req->prompt_ids.push_back(100 + i);
    req->samples.push_back(std::make_unique<Sequence>(next_id_++, req.get(), 0, 1, tokenizer_.get()));
    Sequence* seq = req->samples.back().get();
    requests_.push_back(std::move(req));
    scheduler_.AddWaiting(seq);
    return seq;
  }

  const StepPlan& Schedule() { return scheduler_.Schedule(); }

  // The engine's side of the step just planned.
  void Complete(const StepPlan& plan) {
    for (const ScheduledSeq& s : plan.seqs) {
      s.seq->num_computed += s.num_new_tokens;
      if (s.seq->num_computed == static_cast<int32_t>(s.seq->tokens.size())) {
        s.seq->tokens.push_back(7);
      }
    }
  }

  Scheduler& scheduler() { return scheduler_; }
  KvCacheManager& kv() { return kv_; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  std::vector<std::unique_ptr<RequestState>> requests_;
  uint64_t next_arrival_ = 0;
  SeqId next_id_ = 1;
};

using Planned = std::vector<std::pair<SeqId, int32_t>>;

Planned Rows(const StepPlan& plan) {
  Planned out;
  for (const ScheduledSeq& s : plan.seqs) out.emplace_back(s.seq->id, s.num_new_tokens);
  return out;
}

TEST_CASE("Scheduler: chunked prefill within the token budget, then decode", "[scheduler]") {
  Fixture f(/*num_blocks=*/6, /*budget=*/8, /*max_num_seqs=*/4, PreemptionMode::kRecompute);
  Sequence* a = f.Submit(10);
  Sequence* b = f.Submit(3);

  // A's prompt is larger than the budget: its first chunk takes all of it,
  // and B waits although it would fit in the pool.
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{a->id, 8}});
  REQUIRE(s1.num_tokens == 8);
  REQUIRE(f.scheduler().num_running() == 1);
  REQUIRE(f.scheduler().next_waiting() == b);
  REQUIRE(f.kv().num_free_blocks() == 3);  // all 10 prompt slots reserved at admission
  f.Complete(s1);
  REQUIRE(a->tokens.size() == 10);  // mid-prefill: nothing sampled

  // A's last chunk, then B's whole prompt in the same step.
  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{a->id, 2}, {b->id, 3}});
  REQUIRE(f.kv().num_free_blocks() == 2);
  f.Complete(s2);

  // Both decode one token; A's 11th slot fits its third block, B's 4th its first.
  const StepPlan& s3 = f.Schedule();
  REQUIRE(Rows(s3) == Planned{{a->id, 1}, {b->id, 1}});
  REQUIRE(s3.num_preempted == 0);
  REQUIRE(f.kv().num_free_blocks() == 2);
  f.Complete(s3);

  // B's 5th token needs a second block.
  const StepPlan& s4 = f.Schedule();
  REQUIRE(Rows(s4) == Planned{{a->id, 1}, {b->id, 1}});
  REQUIRE(f.kv().num_free_blocks() == 1);
}

TEST_CASE("Scheduler: the latest arrival is the preemption victim", "[scheduler]") {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    const bool swap = mode == PreemptionMode::kSwap;
    DYNAMIC_SECTION((swap ? "swap" : "recompute")) {
      Fixture f(/*num_blocks=*/4, /*budget=*/64, /*max_num_seqs=*/8, mode,
                /*num_swap_blocks=*/swap ? 4 : 0);
      Sequence* a = f.Submit(4);
      Sequence* b = f.Submit(4);
      Sequence* c = f.Submit(4);
      const StepPlan& s1 = f.Schedule();
      REQUIRE(Rows(s1) == Planned{{a->id, 4}, {b->id, 4}, {c->id, 4}});
      f.Complete(s1);
      REQUIRE(f.kv().num_free_blocks() == 1);

      // Each now needs a second block; one is free. A takes it, B's slot
      // only fits once C (the last in service order) is preempted.
      const StepPlan& s2 = f.Schedule();
      REQUIRE(Rows(s2) == Planned{{a->id, 1}, {b->id, 1}});
      REQUIRE(s2.num_preempted == 1);
      REQUIRE(f.scheduler().num_preemptions() == 1);
      REQUIRE(f.kv().num_free_blocks() == 0);
      if (swap) {
        REQUIRE(c->status == SeqStatus::kSwapped);
        REQUIRE(f.scheduler().next_swapped() == c);
        REQUIRE(f.kv().IsSwapped(c->id));
        REQUIRE(c->num_computed == 4);  // its K/V wait on the host
      } else {
        REQUIRE(c->status == SeqStatus::kWaiting);
        REQUIRE(f.scheduler().next_waiting() == c);
        REQUIRE_FALSE(f.kv().Contains(c->id));
        REQUIRE(c->num_computed == 0);  // prompt + sampled token run again
        REQUIRE(c->tokens.size() == 5);
      }
      f.Complete(s2);

      // No room for C yet: A and B decode inside their second blocks.
      const StepPlan& s3 = f.Schedule();
      REQUIRE(Rows(s3) == Planned{{a->id, 1}, {b->id, 1}});
      REQUIRE(s3.num_preempted == 0);

      // When B finishes, C comes back: swapped in with one decode row, or
      // recomputed from its 5 tokens.
      f.Complete(s3);
      f.scheduler().Remove(b);
      const StepPlan& s4 = f.Schedule();
      REQUIRE(Rows(s4) == Planned{{a->id, 1}, {c->id, swap ? 1 : 5}});
      REQUIRE(c->status == SeqStatus::kRunning);
    }
  }
}

TEST_CASE("Scheduler: priorities first, then strict arrival order", "[scheduler]") {
  Fixture f(/*num_blocks=*/4, /*budget=*/64, /*max_num_seqs=*/8, PreemptionMode::kRecompute);
  Sequence* d = f.Submit(4);
  f.Complete(f.Schedule());  // D holds one block; three are free
  REQUIRE(f.kv().num_free_blocks() == 3);

  Sequence* x = f.Submit(13);  // needs 4 blocks: must wait for D
  Sequence* y = f.Submit(2);   // would fit, but arrived after X
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{d->id, 1}});
  REQUIRE(f.scheduler().next_waiting() == x);
  REQUIRE(f.scheduler().num_waiting() == 2);

  // A more urgent request goes ahead of both, and is admitted.
  Sequence* z = f.Submit(2, /*priority=*/-1);
  REQUIRE(f.scheduler().next_waiting() == z);
  f.Complete(s1);
  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{d->id, 1}, {z->id, 2}});
  REQUIRE(f.scheduler().next_waiting() == x);
  (void)y;
}

TEST_CASE("Scheduler: max_num_seqs caps the running set", "[scheduler]") {
  Fixture f(/*num_blocks=*/8, /*budget=*/64, /*max_num_seqs=*/2, PreemptionMode::kRecompute);
  Sequence* a = f.Submit(3);
  Sequence* b = f.Submit(3);
  Sequence* c = f.Submit(3);
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{a->id, 3}, {b->id, 3}});
  REQUIRE(f.scheduler().next_waiting() == c);
  f.Complete(s1);
  f.scheduler().Remove(a);
  REQUIRE(f.kv().num_free_blocks() == 7);
  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{b->id, 1}, {c->id, 3}});
  REQUIRE(f.scheduler().idle() == false);
}

}  // namespace
}  // namespace kvserve
