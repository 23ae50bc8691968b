// The Scheduler alone, on a tiny pool with hand-made sequences: exact step
// plans (chunked prefill, admission order, budgets), exact preemption victims
// in both modes, priorities and strict first-come-first-served admission,
// swapped sequences ahead of new ones, evicting sequences' whole steps, and
// the samples of an n > 1 request in index order, and per-client fairness
// (clients take turns; a waiting request of another client takes the last
// running one's place).
// The engine's part of a step (running the model, sampling, evicting) is
// played by Complete(): every planned row is computed, a sequence whose
// tokens are all computed gets one more sampled token, and an evicting one
// drops entries as its policy says.
#include "scheduler/scheduler.h"

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/sequence_evictor.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {
namespace {

class Fixture {
 public:
  Fixture(int32_t num_blocks, int32_t budget, int32_t max_num_seqs, PreemptionMode mode,
          int32_t num_swap_blocks = 0, bool fair_clients = false)
      : tokenizer_(Tokenizer::ByteLevel(512)),
        kv_(KvCacheConfig{/*block_size=*/4, num_blocks, num_swap_blocks,
                          /*enable_prefix_caching=*/false}),
        scheduler_(SchedulerConfig{max_num_seqs, budget, mode, fair_clients}, &kv_),
        fair_clients_(fair_clients) {}

  // A one-sample request of `prompt_len` tokens from `client`, queued as
  // waiting. With fairness its client rank is the client's requests so far,
  // as EngineImpl::Admit counts them (none finishes in these tests).
  Sequence* Submit(int32_t prompt_len, int32_t priority = 0, const std::string& client = "") {
    auto req = std::make_unique<RequestState>();
    req->arrival = next_arrival_++;
    req->params.priority = priority;
    req->params.client = client;
    if (fair_clients_) req->client_rank = submitted_per_client_[client]++;
    req->params.n = 1;
    for (int32_t i = 0; i < prompt_len; ++i) req->prompt_ids.push_back(100 + i);
    req->samples.push_back(
        std::make_unique<Sequence>(next_id_++, req.get(), 0, 1, tokenizer_.get()));
    Sequence* seq = req->samples.back().get();
    requests_.push_back(std::move(req));
    scheduler_.AddWaiting(seq);
    return seq;
  }

  // A one-sample request under streaming eviction (4 sinks) that holds at
  // most hold_limit entries after a step's append, queued as waiting.
  Sequence* SubmitStreaming(int32_t prompt_len, int32_t budget, int32_t hold_limit,
                            int32_t priority = 0) {
    Sequence* seq = Submit(prompt_len, priority);
    EvictionParams p;
    p.policy = EvictionPolicyKind::kStreaming;
    p.budget = budget;
    p.sink_tokens = 4;
    seq->evictor = std::make_unique<SequenceEvictor>(
        MakeEvictionPolicy(EvictionPolicyKind::kStreaming), p, hold_limit);
    return seq;
  }

  const StepPlan& Schedule() { return scheduler_.Schedule(); }

  // The engine's side of the step just planned: its copies run, every
  // planned row is computed, and an evicting sequence evicts down to budget
  // - 1 entries (EngineImpl::EvictAfterStep).
  void Complete(const StepPlan& plan) {
    kv_.TakePendingCopies();
    for (const ScheduledSeq& s : plan.seqs) {
      Sequence* seq = s.seq;
      seq->num_computed += s.num_new_tokens;
      kv_.MarkComputed(seq->id, seq->num_computed - seq->cache_offset());
      if (seq->num_computed == static_cast<int32_t>(seq->tokens.size())) seq->tokens.push_back(7);
      if (seq->evictor == nullptr) continue;
      SequenceEvictor& e = *seq->evictor;
      std::vector<int32_t> positions;
      for (int32_t i = e.state().size(); i < seq->num_computed - seq->cache_offset(); ++i) {
        positions.push_back(i + seq->cache_offset());
      }
      e.Observe(positions, {}, 0, 0, s.num_new_tokens);
      const std::vector<int32_t>& victims = e.SelectVictims();
      if (victims.empty()) continue;
      absl::StatusOr<EvictResult> r = kv_.Evict(seq->id, victims);
      REQUIRE(r.ok());
      e.Compact(*r);
      kv_.TakePendingCopies();
    }
  }

  // Samples 1 .. n-1 of `parent`'s request, forked once its prompt is
  // computed and its first token sampled (EngineImpl::Fork).
  std::vector<Sequence*> Fork(Sequence* parent, int32_t n) {
    RequestState* req = parent->request;
    req->params.n = n;
    std::vector<Sequence*> children;
    for (int32_t i = 1; i < n; ++i) {
      auto child = std::make_unique<Sequence>(next_id_++, req, i, 1 + i, tokenizer_.get());
      child->tokens = parent->tokens;
      child->num_computed = parent->num_computed;
      kv_.Fork(parent->id, child->id);
      scheduler_.AddRunning(child.get());
      children.push_back(child.get());
      req->samples.push_back(std::move(child));
    }
    req->forked = true;
    return children;
  }

  Scheduler& scheduler() { return scheduler_; }
  KvCacheManager& kv() { return kv_; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  std::vector<std::unique_ptr<RequestState>> requests_;
  const bool fair_clients_;
  std::map<std::string, int32_t> submitted_per_client_;
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

TEST_CASE("Scheduler: nothing is admitted while a sequence is still swapped out", "[scheduler]") {
  Fixture f(/*num_blocks=*/7, /*budget=*/64, /*max_num_seqs=*/8, PreemptionMode::kSwap,
            /*num_swap_blocks=*/4);
  Sequence* a = f.Submit(8);
  Sequence* b = f.Submit(8);
  Sequence* c = f.Submit(8);
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{a->id, 8}, {b->id, 8}, {c->id, 8}});
  f.Complete(s1);
  REQUIRE(f.kv().num_free_blocks() == 1);

  // Each needs a third block: A takes the free one, B one of the two that
  // swapping C out frees.
  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{a->id, 1}, {b->id, 1}});
  REQUIRE(s2.num_preempted == 1);
  REQUIRE(c->status == SeqStatus::kSwapped);
  f.Complete(s2);
  REQUIRE(f.kv().num_free_blocks() == 1);

  // D's prompt fits the free block, but C (two blocks on the host) cannot
  // come back yet, and D would take the room it waits for.
  Sequence* d = f.Submit(2);
  const StepPlan& s3 = f.Schedule();
  REQUIRE(Rows(s3) == Planned{{a->id, 1}, {b->id, 1}});
  REQUIRE(f.scheduler().next_swapped() == c);
  REQUIRE(f.scheduler().next_waiting() == d);
  REQUIRE(d->status == SeqStatus::kWaiting);
  f.Complete(s3);
  REQUIRE(f.kv().num_free_blocks() == 1);

  // B finishes: C is swapped in (two blocks, a third for its next slot),
  // and only then is D admitted, in the same step.
  f.scheduler().Remove(b);
  const StepPlan& s4 = f.Schedule();
  REQUIRE(Rows(s4) == Planned{{a->id, 1}, {c->id, 1}, {d->id, 2}});
  REQUIRE(f.scheduler().num_swapped() == 0);
  REQUIRE(f.kv().num_free_blocks() == 0);
}

TEST_CASE("Scheduler: an evicting step that does not fit is skipped and later sequences still run",
          "[scheduler][eviction]") {
  // Streaming with budget 8 and a hold limit of 12: after the first chunk
  // the prompt runs in chunks of 12 - 7 = 5 rows.
  Fixture f(/*num_blocks=*/32, /*budget=*/8, /*max_num_seqs=*/8, PreemptionMode::kRecompute);
  Sequence* a = f.SubmitStreaming(40, /*budget=*/8, /*hold_limit=*/12);
  Sequence* b = f.Submit(1, /*priority=*/1);
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{a->id, 8}});
  f.Complete(s1);
  REQUIRE(a->cache_offset() == 1);  // 8 entries, 7 kept

  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{a->id, 5}, {b->id, 1}});
  f.Complete(s2);

  // X goes ahead of both (priority -1); its 7-token prompt gets the 2 rows
  // left in this step.
  Sequence* x = f.Submit(7, /*priority=*/-1);
  const StepPlan& s3 = f.Schedule();
  REQUIRE(Rows(s3) == Planned{{a->id, 5}, {b->id, 1}, {x->id, 2}});
  f.Complete(s3);

  // X's last 5 prompt rows leave 3: A's 5-row step waits whole, B's decode
  // row still runs.
  const StepPlan& s4 = f.Schedule();
  REQUIRE(Rows(s4) == Planned{{x->id, 5}, {b->id, 1}});
  REQUIRE(s4.num_preempted == 0);
  REQUIRE(a->num_computed == 18);
  f.Complete(s4);

  const StepPlan& s5 = f.Schedule();
  REQUIRE(Rows(s5) == Planned{{x->id, 1}, {a->id, 5}, {b->id, 1}});
}

TEST_CASE("Scheduler: n > 1 samples are preempted highest index first and resumed lowest first",
          "[scheduler]") {
  Fixture f(/*num_blocks=*/3, /*budget=*/64, /*max_num_seqs=*/8, PreemptionMode::kSwap,
            /*num_swap_blocks=*/4);
  Sequence* s0 = f.Submit(4);
  const StepPlan& p1 = f.Schedule();
  REQUIRE(Rows(p1) == Planned{{s0->id, 4}});
  f.Complete(p1);
  const std::vector<Sequence*> forked = f.Fork(s0, 4);  // all four share the prompt's block
  Sequence* s1 = forked[0];
  Sequence* s2 = forked[1];
  Sequence* s3 = forked[2];
  REQUIRE(f.kv().num_free_blocks() == 2);

  // Every sample's first token needs a block of its own; two are free.
  // Samples 0 and 1 get them; sample 3 is swapped out first, and as that
  // frees nothing (the prompt block stays shared), then sample 2.
  const StepPlan& p2 = f.Schedule();
  REQUIRE(Rows(p2) == Planned{{s0->id, 1}, {s1->id, 1}});
  REQUIRE(p2.num_preempted == 2);
  REQUIRE(s2->status == SeqStatus::kSwapped);
  REQUIRE(s3->status == SeqStatus::kSwapped);
  REQUIRE(f.scheduler().next_swapped() == s2);
  f.Complete(p2);

  // Samples 0 and 1 finish: three blocks free. Sample 2 comes back (its
  // prompt block and a block for its token); sample 3 would need two more.
  f.scheduler().Remove(s0);
  f.scheduler().Remove(s1);
  REQUIRE(f.kv().num_free_blocks() == 3);
  const StepPlan& p3 = f.Schedule();
  REQUIRE(Rows(p3) == Planned{{s2->id, 1}});
  REQUIRE(s2->status == SeqStatus::kRunning);
  REQUIRE(f.scheduler().next_swapped() == s3);
}

TEST_CASE("Scheduler: with per-client fairness clients take turns at admission", "[scheduler]") {
  for (bool fair : {true, false}) {
    DYNAMIC_SECTION("fair " << fair) {
      Fixture f(/*num_blocks=*/16, /*budget=*/64, /*max_num_seqs=*/2, PreemptionMode::kRecompute,
                /*num_swap_blocks=*/0, fair);
      Sequence* a1 = f.Submit(4, 0, "key:a");
      Sequence* a2 = f.Submit(4, 0, "key:a");
      Sequence* a3 = f.Submit(4, 0, "key:a");
      Sequence* b1 = f.Submit(4, 0, "key:b");
      const StepPlan& s1 = f.Schedule();
      if (fair) {
        // Rank 0 of each client first (a1, then b1 by arrival), then rank 1.
        REQUIRE(Rows(s1) == Planned{{a1->id, 4}, {b1->id, 4}});
        REQUIRE(f.scheduler().next_waiting() == a2);
      } else {
        REQUIRE(Rows(s1) == Planned{{a1->id, 4}, {a2->id, 4}});
        REQUIRE(f.scheduler().next_waiting() == a3);
      }
      REQUIRE(s1.num_preempted == 0);
    }
  }
}

TEST_CASE(
    "Scheduler: with per-client fairness a waiting request of another client takes the last "
    "running one's place",
    "[scheduler]") {
  for (bool fair : {true, false}) {
    DYNAMIC_SECTION("fair " << fair) {
      Fixture f(/*num_blocks=*/16, /*budget=*/64, /*max_num_seqs=*/2, PreemptionMode::kSwap,
                /*num_swap_blocks=*/8, fair);
      Sequence* a1 = f.Submit(4, 0, "key:a");
      Sequence* a2 = f.Submit(4, 0, "key:a");
      Sequence* a3 = f.Submit(4, 0, "key:a");
      const StepPlan& s1 = f.Schedule();
      REQUIRE(Rows(s1) == Planned{{a1->id, 4}, {a2->id, 4}});
      REQUIRE(s1.num_preempted == 0);  // a3 is a1's own client: it waits its turn
      f.Complete(s1);

      Sequence* b1 = f.Submit(4, 0, "key:b");
      const StepPlan& s2 = f.Schedule();
      if (!fair) {
        REQUIRE(Rows(s2) == Planned{{a1->id, 1}, {a2->id, 1}});
        REQUIRE(s2.num_preempted == 0);
        REQUIRE(f.scheduler().next_waiting() == a3);  // b1 behind a3
        continue;
      }
      // b1 (rank 0) is served before a2 (rank 1) and no slot is free: a2 is
      // recomputed (not swapped, although the mode is swap), b1 runs now.
      REQUIRE(Rows(s2) == Planned{{a1->id, 1}, {b1->id, 4}});
      REQUIRE(s2.num_preempted == 1);
      REQUIRE(a2->status == SeqStatus::kWaiting);
      REQUIRE(a2->num_computed == 0);
      REQUIRE_FALSE(f.kv().Contains(a2->id));
      REQUIRE(f.scheduler().num_swapped() == 0);
      REQUIRE(f.scheduler().next_waiting() == a2);  // ahead of a3 (rank 2)
      f.Complete(s2);

      // a2 is not served before b1: no more preemption, both decode.
      const StepPlan& s3 = f.Schedule();
      REQUIRE(Rows(s3) == Planned{{a1->id, 1}, {b1->id, 1}});
      REQUIRE(s3.num_preempted == 0);
      REQUIRE(f.scheduler().num_preemptions() == 1);
    }
  }
}

TEST_CASE("Scheduler: with per-client fairness a waiting request that lacks blocks preempts too",
          "[scheduler]") {
  Fixture f(/*num_blocks=*/4, /*budget=*/64, /*max_num_seqs=*/8, PreemptionMode::kRecompute,
            /*num_swap_blocks=*/0, /*fair_clients=*/true);
  Sequence* a1 = f.Submit(8, 0, "key:a");
  Sequence* a2 = f.Submit(8, 0, "key:a");
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{a1->id, 8}, {a2->id, 8}});
  REQUIRE(f.kv().num_free_blocks() == 0);
  f.Complete(s1);

  // b1 needs one block; a2's two come back, a1's 9th token takes one.
  Sequence* b1 = f.Submit(4, 0, "key:b");
  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{a1->id, 1}, {b1->id, 4}});
  REQUIRE(s2.num_preempted == 1);
  REQUIRE(a2->status == SeqStatus::kWaiting);
  REQUIRE(f.kv().num_free_blocks() == 0);
}

TEST_CASE("Scheduler: with per-client fairness a priority still comes first", "[scheduler]") {
  Fixture f(/*num_blocks=*/16, /*budget=*/64, /*max_num_seqs=*/1, PreemptionMode::kRecompute,
            /*num_swap_blocks=*/0, /*fair_clients=*/true);
  Sequence* a1 = f.Submit(4, /*priority=*/-1, "key:a");
  const StepPlan& s1 = f.Schedule();
  REQUIRE(Rows(s1) == Planned{{a1->id, 4}});
  f.Complete(s1);
  // b1 has rank 0 like a1 but a lower priority (a higher value): it waits.
  Sequence* b1 = f.Submit(4, /*priority=*/0, "key:b");
  const StepPlan& s2 = f.Schedule();
  REQUIRE(Rows(s2) == Planned{{a1->id, 1}});
  REQUIRE(s2.num_preempted == 0);
  REQUIRE(f.scheduler().next_waiting() == b1);
}

}  // namespace
}  // namespace kvserve
