// EngineImpl's step (scheduler/engine_impl.h): the batch built from the
// scheduler's plan, the forward pass, sampling, grammar advance, n > 1 forks,
// eviction after the step, and the events and stats published from it.
// Creation, validation, submission and the engine loop are engine_impl.cc's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "scheduler/engine_impl.h"
#include "spdlog/spdlog.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

absl::Status EngineImpl::RunCopies() {
  StepCopies copies = kv_.TakePendingCopies();
  // Spills read blocks the copies below and the forward pass may overwrite.
  TierTransfers tier = tiers_ != nullptr ? kv_.TakeTierTransfers() : TierTransfers{};
  if (tiers_ != nullptr) KV_RETURN_IF_ERROR(tiers_->RunSpills(tier, *runner_, block_size_));
  if (!copies.swap_out.empty()) KV_RETURN_IF_ERROR(runner_->SwapOut(copies.swap_out));
  if (!copies.copies.empty()) KV_RETURN_IF_ERROR(runner_->CopyBlocks(copies.copies));
  if (!copies.swap_in.empty()) KV_RETURN_IF_ERROR(runner_->SwapIn(copies.swap_in));
  if (tiers_ != nullptr) KV_RETURN_IF_ERROR(tiers_->RunLoads(tier, *runner_));
  // Eviction's refills, last: a move's source may be a block copied above.
  if (!copies.slot_moves.empty()) KV_RETURN_IF_ERROR(runner_->MoveSlots(copies.slot_moves));
  return absl::OkStatus();
}

void EngineImpl::FailRequests(const std::vector<const Sequence*>& seqs, const std::string& error) {
  spdlog::error("engine: {}", error);
  for (const Sequence* seq : seqs) {
    if (!seq->request->done) FinishRequest(seq->request, FinishReason::kError, error);
  }
}

void EngineImpl::BuildBatch(const StepPlan& plan) {
  batch_.Clear();
  int32_t max_blocks = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    max_blocks = std::max(max_blocks, kv_.block_table(s.seq->id).num_blocks());
  }
  batch_.max_blocks_per_seq = max_blocks;
  batch_.block_table.resize(plan.seqs.size() * static_cast<size_t>(max_blocks), 0);
  int32_t* table_row = batch_.block_table.data();
  stats_offset_.clear();
  int64_t stats_total = 0;
  for (size_t b = 0; b < plan.seqs.size(); ++b) {
    const ScheduledSeq& s = plan.seqs[b];
    const Sequence* seq = s.seq;
    const int32_t begin = seq->num_computed;
    const int32_t end = begin + s.num_new_tokens;
    const int32_t offset = seq->cache_offset();  // token index - cache index
    batch_.token_ids.insert(batch_.token_ids.end(), seq->tokens.begin() + begin,
                            seq->tokens.begin() + end);
    for (int32_t i = begin; i < end; ++i) batch_.positions.push_back(i);
    kv_.AppendSlotMapping(seq->id, begin - offset, end - offset, &batch_.slot_mapping);
    batch_.query_start.push_back(batch_.num_tokens());
    batch_.context_len.push_back(end - offset);
    if (seq->evictor) {
      if (const int32_t sinks = seq->evictor->num_sinks(); sinks > 0) {
        batch_.num_sinks.resize(plan.seqs.size(), 0);
        batch_.num_sinks[b] = sinks;
      }
      if (seq->evictor->needs_attention_stats()) {
        batch_.attention_stats.resize(plan.seqs.size(), 0);
        batch_.attention_stats[b] = 1;
        stats_offset_.resize(plan.seqs.size(), -1);
        stats_offset_[b] = stats_total;
        stats_total += int64_t{model_config_.num_layers} * (end - offset);
      }
    }
    if (kv_.has_tails()) batch_.tail_ids.push_back(kv_.tail_id(seq->id));
    const std::vector<BlockId>& blocks = kv_.block_table(seq->id).blocks();
    std::copy(blocks.begin(), blocks.end(), table_row);
    table_row += max_blocks;
    if (end == static_cast<int32_t>(seq->tokens.size())) {
      batch_.logits_rows.push_back(batch_.num_tokens() - 1);
    }
  }
  attn_stats_.resize(stats_total);
}

absl::Status EngineImpl::ObserveStep(const StepPlan& plan) {
  evicting_.clear();
  if (!attn_stats_.empty()) KV_RETURN_IF_ERROR(runner_->ReadAttentionStats(attn_stats_));
  for (size_t b = 0; b < plan.seqs.size(); ++b) {
    Sequence* seq = plan.seqs[b].seq;
    if (!seq->evictor) continue;
    SequenceEvictor& e = *seq->evictor;
    // New entries: cache indices from what the evictor has seen (a prefix
    // hit adds entries no row computed) to the cache's end.
    const int32_t offset = seq->cache_offset();
    const int32_t len = seq->num_computed - offset;
    evict_positions_.clear();
    for (int32_t i = e.state().size(); i < len; ++i) evict_positions_.push_back(i + offset);
    std::span<const float> mass;
    if (b < stats_offset_.size() && stats_offset_[b] >= 0) {
      mass = std::span<const float>(attn_stats_)
                 .subspan(stats_offset_[b], static_cast<size_t>(model_config_.num_layers) * len);
    }
    e.Observe(evict_positions_, mass, model_config_.num_layers, model_config_.num_heads,
              plan.seqs[b].num_new_tokens);
    evicting_.push_back(seq);
  }
  return absl::OkStatus();
}

void EngineImpl::EvictAfterStep() {
  if (evicting_.empty()) return;
  for (Sequence* seq : evicting_) {
    if (seq->finished() || seq->status != SeqStatus::kRunning) continue;
    const std::vector<int32_t>& victims = seq->evictor->SelectVictims();
    if (victims.empty()) continue;
    absl::StatusOr<EvictResult> r = kv_.Evict(seq->id, victims);
    if (!r.ok()) {
      // A block it shares must be copied and the pool is full: preempted, as
      // when its next slot does not fit.
      scheduler_.PreemptRunning(seq);
      continue;
    }
    seq->evictor->Compact(*r);
    const int k = static_cast<int>(seq->evictor->kind());
    ++stats_.kv_evictions[k];
    stats_.kv_evicted_tokens[k] += r->num_evicted;
    stats_.kv_eviction_freed_blocks[k] += r->freed_blocks;
  }
  evicting_.clear();
  if (absl::Status copied = RunCopies(); !copied.ok()) {
    std::vector<const Sequence*> holders;
    for (const std::unique_ptr<RequestState>& req : live_) {
      if (!req->done) holders.push_back(req->samples.front().get());
    }
    FailRequests(holders, absl::StrCat("KV slot move failed: ", std::string(copied.message())));
  }
}

void EngineImpl::Step() {
  step_time_ = clock_->Now();
  const StepPlan& plan = scheduler_.Schedule();
  if (absl::Status copied = RunCopies(); !copied.ok()) {
    // The cache manager already moved the blocks; their bytes are now
    // unknown, so every sequence that holds blocks fails.
    std::vector<const Sequence*> holders;
    for (const std::unique_ptr<RequestState>& req : live_) {
      if (!req->done) holders.push_back(req->samples.front().get());
    }
    FailRequests(holders, absl::StrCat("KV block copy failed: ", std::string(copied.message())));
    return;
  }
  if (plan.empty()) {
    if (plan.num_preempted > 0 || scheduler_.num_running() > 0) return;
    // Nothing runs and the next sequence still cannot start: Submit's checks
    // should make this impossible; fail it rather than spin.
    if (Sequence* seq = scheduler_.next_waiting(); seq != nullptr) {
      spdlog::error("engine: request {} cannot be scheduled on an idle engine; failing it",
                    seq->request->id);
      FinishRequest(seq->request, FinishReason::kError,
                    "the request cannot be scheduled (it does not fit the KV cache)");
    } else if (Sequence* swapped = scheduler_.next_swapped(); swapped != nullptr) {
      spdlog::error("engine: request {} cannot be swapped back in; failing it",
                    swapped->request->id);
      FinishRequest(swapped->request, FinishReason::kError,
                    "the request cannot be swapped back in (it does not fit the KV cache)");
    }
    return;
  }
  for (const ScheduledSeq& s : plan.seqs) {
    RequestState* req = s.seq->request;
    if (req->first_scheduled == absl::InfinitePast()) {
      req->first_scheduled = step_time_;
      stats_.prompt_tokens += req->usage.prompt_tokens;
    }
  }

  BuildBatch(plan);
  const absl::Status status = runner_->Forward(batch_);
  ++stats_.steps;
  stats_.batched_tokens += batch_.num_tokens();
  stats_.batched_seqs += batch_.num_seqs();
  auto fail_plan = [&](const char* what, const absl::Status& st) {
    std::vector<const Sequence*> seqs;
    for (const ScheduledSeq& s : plan.seqs) seqs.push_back(s.seq);
    FailRequests(seqs, absl::StrCat(what, std::string(st.message())));
  };
  if (!status.ok()) {
    step_time_ = clock_->Now();
    fail_plan("forward pass failed: ", status);
    return;
  }
  sample_rows_.clear();
  sample_seqs_.clear();
  int32_t logits_index = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    Sequence* seq = s.seq;
    seq->num_computed += s.num_new_tokens;
    kv_.MarkComputed(seq->id, seq->num_computed - seq->cache_offset());
  }
  // Before forks copy the evictors.
  if (absl::Status observed = ObserveStep(plan); !observed.ok()) {
    step_time_ = clock_->Now();
    fail_plan("reading attention statistics failed: ", observed);
    return;
  }
  for (const ScheduledSeq& s : plan.seqs) {
    Sequence* seq = s.seq;
    if (seq->num_computed < static_cast<int32_t>(seq->tokens.size())) continue;  // mid-prefill
    AddSampleRows(seq, logits_index++);
  }
  if (sampled_.size() < sample_rows_.size()) sampled_.resize(sample_rows_.size());
  const std::span<SampledToken> sampled(sampled_.data(), sample_rows_.size());
  const absl::Status sample_status = runner_->Sample(sample_rows_, sampled);
  step_time_ = clock_->Now();
  if (!sample_status.ok()) {
    fail_plan("sampling failed: ", sample_status);
    return;
  }
  for (size_t i = 0; i < sample_rows_.size(); ++i) {
    EmitToken(sample_seqs_[i], sampled[i].token, sampled[i].logprob, &sampled[i].top);
  }
  for (Sequence* seq : grammar_dead_) {
    FinishRequest(seq->request, FinishReason::kError,
                  "constrained decoding: the grammar allows no token after the output so far");
  }
  grammar_dead_.clear();
  EvictAfterStep();
  if (config_.debug_check_invariants) {
    if (absl::Status s = kv_.CheckInvariants(); !s.ok()) {
      std::fprintf(stderr, "engine: KV cache invariant broken: %s\n",
                   std::string(s.message()).c_str());
      std::abort();
    }
  }
}

void EngineImpl::AddSampleRows(Sequence* seq, int32_t logits_index) {
  RequestState* req = seq->request;
  if (req->forked) {
    AddSampleRow(seq, logits_index);
    return;
  }
  // First token of an n > 1 request: every sample draws from the same raw
  // logits row.
  Fork(seq);
  for (const std::unique_ptr<Sequence>& sample : req->samples) {
    AddSampleRow(sample.get(), logits_index);
  }
}

void EngineImpl::AddSampleRow(Sequence* seq, int32_t logits_index) {
  const GenerateRequest& p = seq->request->params;
  if (seq->grammar && !seq->grammar->PrepareMask(seq->request->stop_ids)) {
    grammar_dead_.push_back(seq);
    return;
  }
  SampleRow& row = sample_rows_.emplace_back();
  row.logits_index = logits_index;
  row.params = &p.sampling;
  row.prompt = seq->prompt();
  row.output = seq->output();
  row.state = &seq->rng;
  row.seed = seq->seed;
  row.num_logprobs = p.logprobs;
  if (seq->grammar) row.allowed = seq->grammar->mask();
  sample_seqs_.push_back(seq);
}

void EngineImpl::Fork(Sequence* parent) {
  RequestState* req = parent->request;
  for (int32_t i = 1; i < req->params.n; ++i) {
    auto child =
        std::make_unique<Sequence>(next_seq_id_++, req, i, req->seed_base + i, tokenizer_.get());
    child->num_computed = parent->num_computed;
    if (parent->evictor) {
      child->evictor = std::make_unique<SequenceEvictor>(*parent->evictor);
      evicting_.push_back(child.get());
    }
    if (parent->grammar) child->grammar = std::make_unique<SequenceGrammar>(*parent->grammar);
    kv_.Fork(parent->id, child->id);
    scheduler_.AddRunning(child.get());
    req->samples.push_back(std::move(child));
  }
  req->num_live += req->params.n - 1;
  req->forked = true;
}

void EngineImpl::EmitToken(Sequence* seq, int32_t token, float logprob,
                           std::vector<std::pair<int32_t, float>>* top) {
  RequestState* req = seq->request;
  const GenerateRequest& p = req->params;
  seq->tokens.push_back(token);
  ++req->usage.completion_tokens;
  ++stats_.generated_tokens;
  if (req->last_token != step_time_) {
    if (req->first_token == absl::InfinitePast()) req->first_token = step_time_;
    req->last_token = step_time_;
    ++req->token_steps;
  }
  seq->out.token_ids.push_back(token);
  if (p.logprobs >= 0) {
    TokenLogprob& lp = seq->out.logprobs.emplace_back();
    lp.token_id = token;
    lp.logprob = logprob;
    lp.top.assign(top->begin(), top->end());
  }
  seq->has_out = true;
  Touch(req);

  if (std::find(req->stop_ids.begin(), req->stop_ids.end(), token) != req->stop_ids.end()) {
    FinishSample(seq, FinishReason::kStop, /*flush_text=*/true);
    return;
  }
  const GrammarStep grammar = seq->grammar ? AdvanceGrammar(seq, token) : GrammarStep::kGoOn;
  piece_scratch_.clear();
  seq->detok.Add(token, &piece_scratch_);
  if (!piece_scratch_.empty() && seq->stop.Add(piece_scratch_, &seq->out.text)) {
    FinishSample(seq, FinishReason::kStop, /*flush_text=*/false);
    return;
  }
  if (grammar == GrammarStep::kRejected) {
    FinishSample(seq, FinishReason::kError, /*flush_text=*/true,
                 "constrained decoding: the sampled token's text does not fit the grammar");
    return;
  }
  if (grammar == GrammarStep::kEnd) {
    FinishSample(seq, FinishReason::kStop, /*flush_text=*/true);
    return;
  }
  const bool bounded = !seq->evictor || !EvictionUnbounded(seq->evictor->kind());
  if (seq->num_output() >= p.max_tokens ||
      (bounded && static_cast<int32_t>(seq->tokens.size()) >= max_model_len_)) {
    FinishSample(seq, FinishReason::kLength, /*flush_text=*/true);
  }
}

EngineImpl::GrammarStep EngineImpl::AdvanceGrammar(Sequence* seq, int32_t token) {
  const int32_t prev = seq->tokens.size() >= 2 ? seq->tokens[seq->tokens.size() - 2] : -1;
  if (!seq->grammar->Accept(tokenizer_->TokenBytes(token, prev))) return GrammarStep::kRejected;
  return seq->grammar->MustEnd() ? GrammarStep::kEnd : GrammarStep::kGoOn;
}

void EngineImpl::FinishSample(Sequence* seq, FinishReason reason, bool flush_text,
                              const std::string& error) {
  if (seq->finished()) return;
  RequestState* req = seq->request;
  if (flush_text) {
    piece_scratch_.clear();
    seq->detok.Finish(&piece_scratch_);
    if (seq->stop.Add(piece_scratch_, &seq->out.text)) {
      reason = FinishReason::kStop;
    } else {
      seq->stop.Flush(&seq->out.text);
    }
  }
  seq->out.finish_reason = reason;
  if (!error.empty()) seq->out.error = error;
  seq->has_out = true;
  Touch(req);
  // Frees its blocks (one waiting for a tier load holds none).
  if (prefetch_ == nullptr || !prefetch_->Cancel(seq)) scheduler_.Remove(seq);
  req->finish_reason = reason;
  if (!error.empty()) req->error = error;
  if (--req->num_live > 0) return;
  req->done = true;
  if (config_.fair_clients) {
    auto it = live_per_client_.find(req->params.client);
    if (--it->second == 0) live_per_client_.erase(it);
  }
  switch (reason) {
    case FinishReason::kStop:
      ++stats_.requests_finished_stop;
      break;
    case FinishReason::kLength:
      ++stats_.requests_finished_length;
      break;
    case FinishReason::kCancelled:
      ++stats_.requests_finished_cancelled;
      break;
    case FinishReason::kError:
      ++stats_.requests_finished_error;
      break;
    case FinishReason::kNone:
      break;
  }
}

void EngineImpl::FinishRequest(RequestState* req, FinishReason reason, const std::string& error) {
  for (const std::unique_ptr<Sequence>& seq : req->samples) {
    FinishSample(seq.get(), reason, /*flush_text=*/false, error);
  }
}

void EngineImpl::Touch(RequestState* req) {
  if (req->in_step) return;
  req->in_step = true;
  touched_.push_back(req);
}

void EngineImpl::FlushEvents() {
  const absl::Time now = clock_->Now();
  for (RequestState* req : touched_) {
    req->in_step = false;
    // Samples 1 .. n-1 of a request that ended before its fork never existed:
    // they still get their final event.
    const int32_t unborn = req->done && !req->forked ? req->params.n - 1 : 0;
    size_t last = req->samples.size();
    if (unborn == 0) {
      for (size_t i = 0; i < req->samples.size(); ++i) {
        if (req->samples[i]->has_out) last = i;
      }
    }
    for (size_t i = 0; i < req->samples.size(); ++i) {
      Sequence* seq = req->samples[i].get();
      if (!seq->has_out) continue;
      GenerateOutput out = std::move(seq->out);
      seq->out = GenerateOutput();
      seq->out.index = seq->index;
      seq->has_out = false;
      if (req->done && i == last) {
        out.request_finished = true;
        out.usage = req->usage;
      }
      req->stream->Push(std::move(out));
    }
    for (int32_t i = 1; i <= unborn; ++i) {
      GenerateOutput out;
      out.index = i;
      out.finish_reason = req->finish_reason;
      out.error = req->error;
      if (i == unborn) {
        out.request_finished = true;
        out.usage = req->usage;
      }
      req->stream->Push(std::move(out));
    }
    if (!req->done) continue;

    if (config_.on_request_finished) {
      RequestMetrics m;
      m.request_id = req->id;
      m.finish_reason = req->finish_reason;
      m.e2e_s = Seconds(now - req->submit_time);
      m.queue_s = req->first_scheduled == absl::InfinitePast()
                      ? m.e2e_s
                      : Seconds(req->first_scheduled - req->submit_time);
      if (req->first_token != absl::InfinitePast()) {
        m.ttft_s = Seconds(req->first_token - req->submit_time);
        if (req->token_steps >= 2) {
          m.tpot_s = Seconds(req->last_token - req->first_token) /
                     static_cast<double>(req->token_steps - 1);
        }
      }
      m.usage = req->usage;
      config_.on_request_finished(m);
    }
    spdlog::debug("engine: request {} finished ({}), {} prompt + {} completion tokens", req->id,
                  std::string(FinishReasonName(req->finish_reason)), req->usage.prompt_tokens,
                  req->usage.completion_tokens);
    req->stream->Close();
  }
  touched_.clear();
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [](const std::unique_ptr<RequestState>& r) { return r->done; }),
              live_.end());
}

void EngineImpl::PublishStats() {
  const int64_t loading = prefetch_ != nullptr ? prefetch_->size() : 0;
  stats_.num_waiting = scheduler_.num_waiting() + loading;
  stats_.num_tier_loading = loading;
  stats_.num_running = scheduler_.num_running();
  stats_.num_swapped = scheduler_.num_swapped();
  stats_.kv = kv_.Stats();
  stats_.preemptions = scheduler_.num_preemptions();
  if (tiers_ != nullptr) {
    stats_.tiers_enabled = true;
    stats_.tiers = tiers_->Stats(stats_.kv, block_size_);
    if (std::string notice = tiers_->tiers().TakeNotice(); !notice.empty()) {
      spdlog::warn("engine: {}", notice);
    }
  }
  num_waiting_.store(stats_.num_waiting, std::memory_order_relaxed);
  absl::MutexLock lock(&stats_mu_);
  published_ = stats_;
}

}  // namespace kvserve
