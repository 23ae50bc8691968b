#include "scheduler/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kvserve {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "scheduler: broken invariant: %s\n", what.c_str());
  std::abort();
}

void CheckOk(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + std::string(s.message()));
}

std::span<const int32_t> Unslotted(const Sequence* seq, int32_t n) {
  return {seq->tokens.data() + seq->tokens.size() - n, static_cast<size_t>(n)};
}

// Whether the sequence's policy must see its whole prompt computed.
bool SkipsPrefixCache(const Sequence* seq) {
  return seq->evictor != nullptr && seq->evictor->needs_attention_stats();
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {
  running_.reserve(config.max_num_seqs);
  plan_.seqs.reserve(config.max_num_seqs);
}

void Scheduler::InsertSorted(std::deque<Sequence*>& queue, Sequence* seq) {
  auto it =
      std::upper_bound(queue.begin(), queue.end(), seq,
                       [](const Sequence* a, const Sequence* b) { return ServedBefore(a, b); });
  queue.insert(it, seq);
}

void Scheduler::InsertRunning(Sequence* seq) {
  auto it =
      std::upper_bound(running_.begin(), running_.end(), seq,
                       [](const Sequence* a, const Sequence* b) { return ServedBefore(a, b); });
  running_.insert(it, seq);
  seq->status = SeqStatus::kRunning;
}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  InsertSorted(waiting_, seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  if (!kv_->Contains(seq->id) || kv_->IsSwapped(seq->id)) {
    Die("AddRunning of a sequence without resident blocks");
  }
  InsertRunning(seq);
}

void Scheduler::Remove(Sequence* seq) {
  auto erase_from = [seq](auto& queue) {
    auto it = std::find(queue.begin(), queue.end(), seq);
    if (it == queue.end()) Die("Remove of a sequence missing from its queue");
    queue.erase(it);
  };
  switch (seq->status) {
    case SeqStatus::kWaiting:
      erase_from(waiting_);
      break;
    case SeqStatus::kRunning:
      erase_from(running_);
      break;
    case SeqStatus::kSwapped:
      erase_from(swapped_);
      break;
    case SeqStatus::kFinished:
      return;
  }
  if (kv_->Contains(seq->id)) kv_->Free(seq->id);
  seq->status = SeqStatus::kFinished;
}

void Scheduler::Preempt(Sequence* victim, bool may_swap) {
  auto it = std::find(running_.begin(), running_.end(), victim);
  if (it == running_.end()) Die("Preempt of a sequence that is not running");
  running_.erase(it);
  ++num_preemptions_;
  ++plan_.num_preempted;
  if (may_swap && config_.preemption_mode == PreemptionMode::kSwap) {
    const SeqId id = victim->id;
    if (kv_->CanSwapOut(std::span<const SeqId>(&id, 1))) {
      CheckOk(kv_->SwapOut(id), "SwapOut after CanSwapOut");
      victim->status = SeqStatus::kSwapped;
      InsertSorted(swapped_, victim);
      return;
    }
    // Host pool full: fall back to recompute.
  }
  kv_->Free(victim->id);
  victim->num_computed = 0;
  if (victim->evictor) victim->evictor->Reset();
  AddWaiting(victim);
}

std::span<const int32_t> Scheduler::AdmissionTokens(const Sequence* seq) const {
  if (!seq->evictor) return std::span<const int32_t>(seq->tokens);
  return std::span<const int32_t>(seq->tokens.data(), static_cast<size_t>(EvictingRows(seq)));
}

int32_t Scheduler::PromisedSlots() const {
  int32_t slots = 0;
  for (const Sequence* seq : running_) slots += seq->request->forked ? 1 : seq->request->params.n;
  return slots;
}

int32_t Scheduler::PreemptForWaiting() {
  int32_t preempted = 0;
  while (!waiting_.empty() && !running_.empty()) {
    Sequence* next = waiting_.front();
    Sequence* last = running_.back();
    if (next->request->params.client == last->request->params.client) break;
    if (!ServedBefore(next, last)) break;
    const RequestState* req = next->request;
    const int32_t slots = req->forked ? 1 : req->params.n;
    if (PromisedSlots() + slots <= config_.max_num_seqs &&
        kv_->CanAllocate(AdmissionTokens(next), req->params.cache_salt, !SkipsPrefixCache(next))) {
      break;  // it fits as things are
    }
    Preempt(last, /*may_swap=*/false);
    ++preempted;
  }
  return preempted;
}

int32_t Scheduler::EvictingRows(const Sequence* seq) const {
  const int32_t prompt_left = std::max(0, seq->prompt_len() - seq->num_computed);
  const int32_t cache_len = seq->num_computed - seq->cache_offset();
  return std::min(seq->evictor->StepRows(cache_len, prompt_left), config_.max_num_batched_tokens);
}

bool Scheduler::ReserveRows(Sequence* seq, int32_t rows) {
  const int32_t reserved = kv_->num_tokens(seq->id) + seq->cache_offset();
  const int32_t need = seq->num_computed + rows - reserved;
  if (need <= 0) return true;
  while (!kv_->CanAppend(seq->id, need)) {
    Sequence* victim = running_.back();
    Preempt(victim);
    if (victim == seq) return false;
  }
  CheckOk(kv_->Append(seq->id, std::span<const int32_t>(seq->tokens.data() + reserved,
                                                        static_cast<size_t>(need))),
          "Append after CanAppend");
  return true;
}

bool Scheduler::ReserveDecodeSlots(Sequence* seq) {
  const int32_t unslotted = static_cast<int32_t>(seq->tokens.size()) - kv_->num_tokens(seq->id);
  if (unslotted == 0) return true;
  while (!kv_->CanAppend(seq->id, unslotted)) {
    Sequence* victim = running_.back();
    Preempt(victim);
    if (victim == seq) return false;
  }
  CheckOk(kv_->Append(seq->id, Unslotted(seq, unslotted)), "Append after CanAppend");
  return true;
}

void Scheduler::Plan(Sequence* seq, int32_t num_new) {
  plan_.seqs.push_back({seq, num_new});
  plan_.num_tokens += num_new;
  budget_ -= num_new;
}

const StepPlan& Scheduler::Schedule() {
  plan_.seqs.clear();
  plan_.num_tokens = 0;
  plan_.num_preempted = 0;
  budget_ = config_.max_num_batched_tokens;

  // 0. Fairness: the next waiting sequence of another client takes the place
  //    of the last running one it is served before.
  const int32_t fair_preempted = config_.fair_clients ? PreemptForWaiting() : 0;

  // 1. Running sequences first, in service order; preempt from the back.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->evictor) {
      const int32_t rows = EvictingRows(seq);
      if (rows > budget_) continue;        // whole steps only
      if (!ReserveRows(seq, rows)) break;  // it was the last one left
      Plan(seq, rows);
      continue;
    }
    if (!ReserveDecodeSlots(seq)) break;  // it was the last one left
    Plan(seq, std::min(seq->num_uncomputed(), budget_));
  }
  if (plan_.num_preempted > fair_preempted) return plan_;

  // Sequence slots already promised: samples of unforked n > 1 requests.
  int32_t seq_slots = PromisedSlots();

  // 2. Swapped sequences come back before anything new is admitted.
  while (!swapped_.empty() && budget_ > 0 && seq_slots < config_.max_num_seqs) {
    Sequence* seq = swapped_.front();
    const SeqId id = seq->id;
    if (!kv_->CanSwapIn(std::span<const SeqId>(&id, 1))) break;
    const int32_t rows = seq->evictor ? EvictingRows(seq) : 0;
    if (rows > budget_) break;
    CheckOk(kv_->SwapIn(id), "SwapIn after CanSwapIn");
    const int32_t reserved = kv_->num_tokens(id) + seq->cache_offset();
    const int32_t unslotted = seq->evictor ? seq->num_computed + rows - reserved
                                           : static_cast<int32_t>(seq->tokens.size()) - reserved;
    if (unslotted > 0 && !kv_->CanAppend(id, unslotted)) {
      // Its next slot does not fit yet: back to the host blocks it came from.
      CheckOk(kv_->SwapOut(id), "SwapOut of a sequence just swapped in");
      break;
    }
    if (unslotted > 0) {
      CheckOk(kv_->Append(id, std::span<const int32_t>(seq->tokens.data() + reserved,
                                                       static_cast<size_t>(unslotted))),
              "Append");
    }
    swapped_.pop_front();
    InsertRunning(seq);
    seq_slots += 1;
    Plan(seq, seq->evictor ? rows : std::min(seq->num_uncomputed(), budget_));
  }
  if (!swapped_.empty()) return plan_;

  // 3. Admit waiting sequences in service order; the first that does not fit
  //    stops admission.
  while (!waiting_.empty() && budget_ > 0) {
    Sequence* seq = waiting_.front();
    RequestState* req = seq->request;
    const int32_t slots = req->forked ? 1 : req->params.n;
    if (seq_slots + slots > config_.max_num_seqs) break;
    // An evicting sequence reserves its first step only.
    const int32_t rows = seq->evictor ? EvictingRows(seq) : 0;
    if (rows > budget_) break;
    const std::span<const int32_t> reserve = AdmissionTokens(seq);
    const bool use_cache = !SkipsPrefixCache(seq);
    if (!kv_->CanAllocate(reserve, req->params.cache_salt, use_cache)) break;
    absl::StatusOr<AllocateResult> r =
        kv_->Allocate(seq->id, reserve, req->params.cache_salt, use_cache);
    CheckOk(r.status(), "Allocate after CanAllocate");
    seq->num_computed = r->num_cached_tokens;
    if (!req->cached_counted) {
      req->usage.cached_prompt_tokens = r->num_cached_tokens;
      req->cached_counted = true;
    }
    waiting_.pop_front();
    InsertRunning(seq);
    seq_slots += slots;
    Plan(seq, seq->evictor ? rows - seq->num_computed : std::min(seq->num_uncomputed(), budget_));
  }
  return plan_;
}

}  // namespace kvserve
