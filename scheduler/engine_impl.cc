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
                                  std::string(EvictionPolicyName(eviction.policy)), " ",
                                  kNoEvictionReason));
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
  kv_config.partial_rows_in_blocks = runner->partial_rows_in_blocks();
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
    if (t.remote() != nullptr || t.disk() != nullptr) {
      // Disk and remote loads in the background (tier_prefetch.h).
      t.set_background_loads(true);
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
        if (tiers_ != nullptr && tiers_->tiers().remote() != nullptr) {
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
    // The last step's spills into the host tier are listed before any
    // lookup (admission's walk, the scheduler's Allocate).
    if (tiers_ != nullptr) {
      if (absl::Status s = tiers_->FinishSpills(*runner_); !s.ok()) {
        std::vector<const Sequence*> holders;
        for (const std::unique_ptr<RequestState>& r : live_) {
          if (!r->done) holders.push_back(r->samples.front().get());
        }
        FailRequests(holders, absl::StrCat("KV tier spill failed: ", std::string(s.message())));
      }
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
      prefetch_->Wait(1);  // only tier loads are pending
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
  // Its prompt's disk and remote blocks first, if any (tier_prefetch.h).
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

}  // namespace kvserve
