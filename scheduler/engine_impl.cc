#include "scheduler/engine_impl.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "scheduler/request_validation.h"
#include "spdlog/spdlog.h"
#include "util/field_status.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       std::unique_ptr<ModelRunner> runner,
                                                       std::shared_ptr<const Tokenizer> tokenizer) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<EngineImpl> engine,
                      EngineImpl::Create(config, std::move(runner), std::move(tokenizer)));
  return std::unique_ptr<Engine>(std::move(engine));
}

absl::StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::Create(
    const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
    std::shared_ptr<const Tokenizer> tokenizer) {
  KV_RETURN_IF_ERROR(config.Validate());
  if (runner == nullptr) return Invalid("engine: no model runner");
  if (tokenizer == nullptr) return Invalid("engine: no tokenizer");
  const ModelConfig& mc = runner->config();
  const int32_t max_len =
      config.max_model_len == 0 ? mc.max_position_embeddings : config.max_model_len;
  if (max_len > mc.max_position_embeddings) {
    return Invalid(absl::StrCat("max_model_len (", max_len,
                                ") exceeds the model's max_position_embeddings (",
                                mc.max_position_embeddings, ")"));
  }
  if (tokenizer->vocab_size() > mc.vocab_size) {
    return Invalid(absl::StrCat("the tokenizer has ", tokenizer->vocab_size(),
                                " pieces but the model's vocabulary is ", mc.vocab_size));
  }
  // KV eviction defaults, resolved against the model.
  EvictionParams eviction = config.eviction;
  const int32_t window = mc.sliding_window;
  if (eviction.policy == EvictionPolicyKind::kSlidingWindow && eviction.budget == 0) {
    if (window <= 0) {
      return Invalid(
          "cache.eviction_budget must be set for sliding_window (the model has no sliding_window)");
    }
    eviction.budget = window;
  }
  if (eviction.evicts()) {
    KV_RETURN_IF_ERROR(eviction.Validate(kEvictionConfigFields));
    if (!runner->supports_eviction()) {
      return Invalid(absl::StrCat("cache.eviction_policy ",
                                  std::string(EvictionPolicyName(eviction.policy)),
                                  " needs KV eviction, which this model runner does not have "
                                  "for this cache.kv_dtype (CPU: every one but int4_kc; "
                                  "CUDA: one per-token dtype in every layer)"));
    }
    if (window > 0 && eviction.budget > window) {
      return Invalid(absl::StrCat("cache.eviction_budget (", eviction.budget,
                                  ") exceeds the model's sliding_window (", window, ")"));
    }
  }
  std::shared_ptr<const EvictorModel> evictor_model;
  if (!config.evictor_model.empty()) {
    absl::StatusOr<EvictorModel> m = EvictorModel::Load(config.evictor_model);
    if (!m.ok()) {
      return Invalid(absl::StrCat("cache.evictor_model: ", std::string(m.status().message())));
    }
    evictor_model = std::make_shared<const EvictorModel>(*m);
  }
  KvCacheConfig kv_config;
  kv_config.block_size = runner->kv_format().block_size();
  kv_config.num_blocks = runner->num_blocks();
  kv_config.num_swap_blocks = runner->num_swap_blocks();
  kv_config.num_tail_blocks = runner->num_tail_blocks();
  kv_config.num_swap_tail_blocks = runner->num_swap_tail_blocks();
  kv_config.enable_prefix_caching = config.prefix_caching;
  std::unique_ptr<EngineTiers> tiers;
  if (config.tiers.enabled()) {
    KV_ASSIGN_OR_RETURN(tiers,
                        EngineTiers::Create(config.tiers, *runner, config.weights_fingerprint));
  }
  // Tiers outlive the engine and are shared by replicas: their chains must
  // be seeded alike.
  kv_config.hash_seed = tiers != nullptr ? tiers->hash_seed() : std::random_device{}();
  KV_RETURN_IF_ERROR(kv_config.Validate());
  const int64_t blocks_needed = BlocksForTokens(max_len, kv_config.block_size);
  if (blocks_needed > kv_config.num_blocks) {
    return Invalid(absl::StrCat("max_model_len (", max_len, " tokens) needs ", blocks_needed,
                                " KV blocks of ", kv_config.block_size,
                                " tokens, but the pool has only ", kv_config.num_blocks,
                                "; lower max_model_len or give the KV cache more blocks"));
  }
  spdlog::debug(
      "engine: {} KV blocks of {} tokens ({} swap), max_model_len {}, max_num_seqs {}, "
      "max_num_batched_tokens {}, prefix caching {}, preemption {}",
      kv_config.num_blocks, kv_config.block_size, kv_config.num_swap_blocks, max_len,
      config.max_num_seqs, config.max_num_batched_tokens, config.prefix_caching ? "on" : "off",
      config.preemption_mode == PreemptionMode::kSwap ? "swap" : "recompute");
  return std::unique_ptr<EngineImpl>(new EngineImpl(config, max_len, std::move(runner),
                                                    std::move(tokenizer), kv_config, eviction,
                                                    std::move(evictor_model), std::move(tiers)));
}

EngineImpl::EngineImpl(const EngineConfig& config, int32_t max_model_len,
                       std::unique_ptr<ModelRunner> runner,
                       std::shared_ptr<const Tokenizer> tokenizer, const KvCacheConfig& kv_config,
                       const EvictionParams& eviction,
                       std::shared_ptr<const EvictorModel> evictor_model,
                       std::unique_ptr<EngineTiers> tiers)
    : config_(config),
      clock_(config.clock != nullptr ? config.clock : RealClock()),
      max_model_len_(max_model_len),
      model_config_(runner->config()),
      runner_(std::move(runner)),
      tokenizer_(std::move(tokenizer)),
      vocab_size_(model_config_.vocab_size),
      block_size_(kv_config.block_size),
      num_blocks_(kv_config.num_blocks),
      grammars_(tokenizer_, vocab_size_),
      default_eviction_(eviction),
      tiers_(std::move(tiers)),
      kv_(kv_config),
      scheduler_(SchedulerConfig{config.max_num_seqs, config.max_num_batched_tokens,
                                 config.preemption_mode, config.fair_clients},
                 &kv_),
      seed_rng_(std::random_device{}()) {
  if (tiers_ != nullptr) {
    KvTiers& t = tiers_->tiers();
    kv_.set_tier_source(&t, /*write_through=*/t.remote() != nullptr);
    if (t.remote() != nullptr) {
      prefetch_ = std::make_unique<TierPrefetch>(&t, &kv_, config.tiers.load_timeout_ms);
    }
  }
  policies_.resize(kNumEvictionPolicies);
  for (EvictionPolicyKind k : kAllEvictionPolicies) {
    if (k == EvictionPolicyKind::kNone) continue;
    if (k == EvictionPolicyKind::kLearned) {
      if (evictor_model) policies_[static_cast<int>(k)] = MakeLearnedPolicy(evictor_model);
      continue;
    }
    policies_[static_cast<int>(k)] = MakeEvictionPolicy(k);
  }
  bounds_.max_model_len = max_model_len_;
  bounds_.block_size = block_size_;
  bounds_.num_blocks = num_blocks_;
  bounds_.sliding_window = model_config_.sliding_window;
  bounds_.eviction = default_eviction_;
  bounds_.runner_evicts = runner_->supports_eviction();
  for (size_t k = 0; k < policies_.size(); ++k) {
    if (policies_[k] != nullptr) bounds_.available_policies |= 1u << k;
  }
  sample_rows_.reserve(config.max_num_seqs);
  sample_seqs_.reserve(config.max_num_seqs);
  touched_.reserve(config.max_num_seqs);
  PublishStats();
  thread_ = std::thread([this] { Loop(); });
}

EngineImpl::~EngineImpl() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

// ---- Front-end side ----------------------------------------------------------

absl::Status EngineImpl::ResolveEviction(const KvPolicyOverride& o, RequestState* req) const {
  KV_ASSIGN_OR_RETURN(req->eviction, ResolveRequestEviction(o, bounds_));
  if (!req->eviction.evicts()) return absl::OkStatus();
  req->policy = policies_[static_cast<int>(req->eviction.policy)];
  req->hold_limit = EvictionHoldLimit(req->eviction, bounds_);
  return absl::OkStatus();
}

absl::Status EngineImpl::Validate(GenerateRequest& r, RequestState* req) const {
  std::vector<int32_t>* prompt_ids = &req->prompt_ids;
  RequestLimits limits = ResolveRequestLimits(config_.request_limits, max_model_len_);
  limits.max_samples = std::min(limits.max_samples, config_.max_num_seqs);
  limits.vocab_size = vocab_size_;
  KV_RETURN_IF_ERROR(ValidateRequestParams(r, limits));
  KV_RETURN_IF_ERROR(ResolveEviction(r.kv_policy, req));
  if (!r.constraint.empty()) {
    // A backend whose sampler applies no token masks (docs/structured-outputs.md).
    if (!runner_->supports_token_masks()) {
      return FieldError(r.constraint.field,
                        absl::StrCat(r.constraint.field,
                                     ": constrained decoding needs a sampler that applies token "
                                     "masks; this server samples on ",
                                     runner_->memory_info().device));
    }
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = grammars_.Compile(r.constraint);
    if (!g.ok()) return g.status();
    req->grammar = *std::move(g);
  }
  if (!r.prompt_token_ids.empty()) {
    *prompt_ids = std::move(r.prompt_token_ids);
    r.prompt_token_ids.clear();
  } else {
    *prompt_ids = tokenizer_->Encode(r.prompt, r.add_bos);
  }
  r.prompt.clear();
  r.prompt.shrink_to_fit();
  return CheckRequestFits(static_cast<int64_t>(prompt_ids->size()), r.max_tokens, req->eviction,
                          req->hold_limit, bounds_);
}

absl::StatusOr<std::shared_ptr<RequestStream>> EngineImpl::Submit(GenerateRequest request) {
  if (draining()) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError("the engine is draining and accepts no new requests");
  }
  auto req = std::make_unique<RequestState>();
  if (absl::Status s = Validate(request, req.get()); !s.ok()) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  if (!request.ignore_eos) {
    req->stop_ids.push_back(model_config_.eos_id);
    req->stop_ids.insert(req->stop_ids.end(), model_config_.stop_ids.begin(),
                         model_config_.stop_ids.end());
    if (model_config_.bos_is_stop) req->stop_ids.push_back(model_config_.bos_id);
  }
  req->stop_ids.insert(req->stop_ids.end(), request.stop_token_ids.begin(),
                       request.stop_token_ids.end());
  req->usage.prompt_tokens = static_cast<int32_t>(req->prompt_ids.size());
  req->submit_time = clock_->Now();
  req->params = std::move(request);

  absl::MutexLock lock(&mu_);
  if (stop_ || draining()) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError("the engine is draining and accepts no new requests");
  }
  const int64_t queued =
      static_cast<int64_t>(inbox_.size()) + num_waiting_.load(std::memory_order_relaxed);
  if (queued >= config_.max_queue_size) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request queue is full (", queued,
        " requests waiting; scheduler.max_queue_size = ", config_.max_queue_size, ")"));
  }
  req->arrival = next_arrival_++;
  if (req->params.request_id.empty()) req->params.request_id = absl::StrCat("req-", req->arrival);
  req->id = req->params.request_id;
  req->seed_base = req->params.sampling.seed.has_value() ? *req->params.sampling.seed : seed_rng_();
  req->stream = std::make_shared<RequestStream>(req->id);
  std::shared_ptr<RequestStream> stream = req->stream;
  inbox_.push_back(std::move(req));
  return stream;
}

EngineStats EngineImpl::GetStats() const {
  EngineStats s;
  {
    absl::MutexLock lock(&stats_mu_);
    s = published_;
  }
  {
    absl::MutexLock lock(&mu_);
    s.num_waiting += static_cast<int64_t>(inbox_.size());
  }
  s.requests_rejected = rejected_.load(std::memory_order_relaxed);
  return s;
}

void EngineImpl::Drain(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // The engine thread compares the deadline with clock_ at every loop
  // iteration (it is never asleep while requests are live), so a simulated
  // clock decides when it has passed.
  drain_deadline_ = std::min(drain_deadline_, deadline);
  draining_.store(true, std::memory_order_release);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return idle_ && inbox_.empty(); };
  mu_.Await(absl::Condition(&idle));
}

// ---- Engine thread -------------------------------------------------------------

void EngineImpl::Loop() {
  for (;;) {
    bool stop = false;
    bool cancel_all = false;
    {
      absl::MutexLock lock(&mu_);
      if (live_.empty() && inbox_.empty() && !stop_) {
        idle_ = true;
        auto wake = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inbox_.empty() || stop_; };
        if (prefetch_ != nullptr) {
          // The remote tier's worker still counts write-throughs: publish them.
          mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(100));
        } else {
          mu_.Await(absl::Condition(&wake));
        }
      }
      idle_ = false;
      incoming_.swap(inbox_);
      stop = stop_;
      cancel_all = draining_.load(std::memory_order_acquire) && clock_->Now() >= drain_deadline_;
    }
    for (std::unique_ptr<RequestState>& req : incoming_) Admit(std::move(req));
    incoming_.clear();
    CancelRequests(stop || cancel_all);
    if (prefetch_ != nullptr) {
      ready_.clear();
      prefetch_->Poll(&ready_);
      for (Sequence* seq : ready_) scheduler_.AddWaiting(seq);
    }
    if (!stop && !scheduler_.idle()) {
      Step();
    } else if (!stop && prefetch_ != nullptr) {
      prefetch_->Wait(1);  // only remote loads are pending
    }
    PublishStats();
    FlushEvents();
    if (stop) return;
  }
}

void EngineImpl::Admit(std::unique_ptr<RequestState> req) {
  auto seq =
      std::make_unique<Sequence>(next_seq_id_++, req.get(), 0, req->seed_base, tokenizer_.get());
  if (req->policy) {
    seq->evictor = std::make_unique<SequenceEvictor>(req->policy, req->eviction, req->hold_limit);
  }
  if (req->grammar) seq->grammar = std::make_unique<SequenceGrammar>(req->grammar);
  req->num_live = 1;
  req->forked = req->params.n == 1;
  if (config_.fair_clients) req->client_rank = live_per_client_[req->params.client]++;
  // Its prompt's remote blocks first, if any (tier_prefetch.h).
  if (prefetch_ == nullptr || !prefetch_->MaybeHold(seq.get())) scheduler_.AddWaiting(seq.get());
  req->samples.push_back(std::move(seq));
  live_.push_back(std::move(req));
}

void EngineImpl::CancelRequests(bool all) {
  for (const std::unique_ptr<RequestState>& req : live_) {
    if (req->done) continue;
    if (all || req->stream->cancelled()) FinishRequest(req.get(), FinishReason::kCancelled);
  }
}

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
  // Frees its blocks (one waiting for a remote load holds none).
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
  stats_.num_waiting = scheduler_.num_waiting();
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
  num_waiting_.store(scheduler_.num_waiting(), std::memory_order_relaxed);
  absl::MutexLock lock(&stats_mu_);
  published_ = stats_;
}

}  // namespace kvserve
