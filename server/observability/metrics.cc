#include "server/observability/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/resource.h>

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/observability/tier_metrics.h"

namespace kvserve {
namespace {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

Counter& NewCounter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

Gauge& NewGauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

Histogram& NewHistogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                        Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

// Counters only move forward: add what the engine counted since last time.
void Advance(Counter& c, int64_t now, int64_t before) {
  if (now > before) c.Increment(static_cast<double>(now - before));
}

}  // namespace

struct ServerMetrics::Handles {
  Counter* finished_stop;
  Counter* finished_length;
  Counter* finished_cancelled;
  Counter* finished_error;
  Counter* rejected;
  Gauge* queue_length;
  Gauge* running;
  Gauge* swapped;
  Gauge* tier_loading;
  Gauge* usage_active;
  Gauge* usage_with_cached;
  Gauge* blocks_active;
  Gauge* blocks_cached;
  Gauge* blocks_free;
  Gauge* blocks_capacity;
  Counter* prefix_queries;
  Counter* prefix_hits;
  Counter* preemptions;
  Counter* swap_out;
  Counter* swap_in;
  Counter* cow_copies;
  Counter* cached_evictions;
  // KV eviction, per policy (index: EvictionPolicyKind; none stays 0).
  Counter* kv_evictions[kNumEvictionPolicies];
  Counter* kv_evicted_tokens[kNumEvictionPolicies];
  Counter* kv_eviction_freed_blocks[kNumEvictionPolicies];
  Counter* steps;
  Counter* batched_tokens;
  Counter* batched_seqs;
  Counter* prompt_tokens;
  Counter* generation_tokens;
  Histogram* ttft;
  Histogram* tpot;
  Histogram* e2e;
  Histogram* queue_time;
  Histogram* request_prompt_tokens;
  Histogram* request_generation_tokens;
  Gauge* ready;
  Gauge* http_open_connections;
  Gauge* weight_bytes;
  Gauge* activation_bytes;
  Gauge* block_bytes;
  Gauge* pool_bytes;
  Gauge* pool_tokens;
  Gauge* swap_blocks;
  Counter* cpu_seconds;
  prometheus::Family<Counter>* http_responses;
  absl::Mutex http_mu;
  absl::flat_hash_map<int, Counter*> http_by_code ABSL_GUARDED_BY(http_mu);
};

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()), h_(std::make_unique<Handles>()) {
  prometheus::Registry& r = *registry_;
  auto& requests = prometheus::BuildCounter()
                       .Name("kvserve_requests_total")
                       .Help("Finished requests by finish reason.")
                       .Register(r);
  h_->finished_stop = &requests.Add({{"finish_reason", "stop"}});
  h_->finished_length = &requests.Add({{"finish_reason", "length"}});
  h_->finished_cancelled = &requests.Add({{"finish_reason", "cancelled"}});
  h_->finished_error = &requests.Add({{"finish_reason", "error"}});
  h_->rejected = &NewCounter(r, "kvserve_requests_rejected_total",
                             "Requests refused at submission (queue full, draining).");
  h_->queue_length =
      &NewGauge(r, "kvserve_queue_length", "Requests waiting to be scheduled (incl. preempted).");
  h_->running = &NewGauge(r, "kvserve_running_sequences", "Sequences in the running batch.");
  h_->swapped = &NewGauge(r, "kvserve_swapped_sequences", "Sequences swapped out to host memory.");
  h_->tier_loading = &NewGauge(r, "kvserve_kv_tier_loading_requests",
                               "Requests waiting for their KV blocks from the disk or remote tier "
                               "(in the queue length too).");

  auto& usage = prometheus::BuildGauge()
                    .Name("kvserve_kv_usage_ratio")
                    .Help(
                        "Fraction of KV blocks in use: by live sequences (active), or also "
                        "holding reusable cached prefixes (with_cached).")
                    .Register(r);
  h_->usage_active = &usage.Add({{"kind", "active"}});
  h_->usage_with_cached = &usage.Add({{"kind", "with_cached"}});
  auto& blocks = prometheus::BuildGauge()
                     .Name("kvserve_kv_blocks")
                     .Help(
                         "KV blocks by state: active (held by sequences), cached (free but "
                         "holding a reusable prefix), free (empty).")
                     .Register(r);
  h_->blocks_active = &blocks.Add({{"state", "active"}});
  h_->blocks_cached = &blocks.Add({{"state", "cached"}});
  h_->blocks_free = &blocks.Add({{"state", "free"}});
  h_->blocks_capacity = &NewGauge(r, "kvserve_kv_blocks_capacity", "KV blocks in the pool.");

  h_->prefix_queries = &NewCounter(r, "kvserve_prefix_cache_queries_tokens_total",
                                   "Prompt tokens looked up in the prefix cache.");
  h_->prefix_hits = &NewCounter(r, "kvserve_prefix_cache_hits_tokens_total",
                                "Prompt tokens served from the prefix cache.");
  h_->preemptions = &NewCounter(r, "kvserve_preemptions_total", "Sequences preempted.");
  h_->swap_out =
      &NewCounter(r, "kvserve_swap_out_blocks_total", "KV blocks swapped out to host memory.");
  h_->swap_in =
      &NewCounter(r, "kvserve_swap_in_blocks_total", "KV blocks swapped back in from host memory.");
  h_->cow_copies = &NewCounter(r, "kvserve_copy_on_write_blocks_total",
                               "KV blocks copied on write (shared blocks written to).");
  h_->cached_evictions = &NewCounter(r, "kvserve_cached_block_evictions_total",
                                     "Cached prefix blocks reclaimed for new allocations.");
  {
    auto& evictions = prometheus::BuildCounter()
                          .Name("kvserve_kv_evictions_total")
                          .Help(
                              "KV evictions (steps in which a sequence dropped entries), by "
                              "policy.")
                          .Register(r);
    auto& tokens = prometheus::BuildCounter()
                       .Name("kvserve_kv_evicted_tokens_total")
                       .Help("KV entries dropped by eviction, by policy.")
                       .Register(r);
    auto& freed = prometheus::BuildCounter()
                      .Name("kvserve_kv_eviction_freed_blocks_total")
                      .Help("KV blocks sequences gave back by evicting, by policy.")
                      .Register(r);
    for (EvictionPolicyKind k : kAllEvictionPolicies) {
      const int i = static_cast<int>(k);
      const std::string name(EvictionPolicyName(k));
      h_->kv_evictions[i] = &evictions.Add({{"policy", name}});
      h_->kv_evicted_tokens[i] = &tokens.Add({{"policy", name}});
      h_->kv_eviction_freed_blocks[i] = &freed.Add({{"policy", name}});
    }
  }
  h_->steps = &NewCounter(r, "kvserve_engine_steps_total", "Engine steps (forward passes).");
  h_->batched_tokens =
      &NewCounter(r, "kvserve_batched_tokens_total", "Tokens run through the model, all steps.");
  h_->batched_seqs = &NewCounter(r, "kvserve_batched_sequences_total",
                                 "Sequences run through the model, all steps (mean batch = this / "
                                 "steps).");
  h_->prompt_tokens = &NewCounter(r, "kvserve_prompt_tokens_total", "Prompt tokens prefilled.");
  h_->generation_tokens = &NewCounter(r, "kvserve_generation_tokens_total", "Tokens generated.");

  const Histogram::BucketBoundaries latency = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320};
  const Histogram::BucketBoundaries per_token = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                 0.05,   0.075, 0.1,    0.15,  0.2,  0.3,
                                                 0.4,    0.5,   0.75,   1,     2.5};
  const Histogram::BucketBoundaries tokens = {1,    4,    16,   64,   128,   256,  512,
                                              1024, 2048, 4096, 8192, 16384, 32768};
  h_->ttft = &NewHistogram(r, "kvserve_time_to_first_token_seconds",
                           "Time from submission to the first generated token.", latency);
  h_->tpot =
      &NewHistogram(r, "kvserve_time_per_output_token_seconds",
                    "Mean time per generated token after the first, per request.", per_token);
  h_->e2e = &NewHistogram(r, "kvserve_e2e_request_latency_seconds",
                          "Time from submission to the end of the request.", latency);
  h_->queue_time = &NewHistogram(r, "kvserve_queue_time_seconds",
                                 "Time from submission to first being scheduled.", latency);
  h_->request_prompt_tokens = &NewHistogram(r, "kvserve_request_prompt_tokens",
                                            "Prompt tokens per finished request.", tokens);
  h_->request_generation_tokens = &NewHistogram(r, "kvserve_request_generation_tokens",
                                                "Generated tokens per finished request.", tokens);
  h_->ready = &NewGauge(r, "kvserve_ready", "1 while accepting requests; 0 loading or draining.");
  h_->weight_bytes = &NewGauge(r, "kvserve_model_weight_bytes",
                               "Bytes of model weights as the runner holds them.");
  h_->activation_bytes =
      &NewGauge(r, "kvserve_activation_bytes",
                "Bytes of activations and workspaces (CUDA: measured by the profile run).");
  h_->block_bytes =
      &NewGauge(r, "kvserve_kv_block_bytes", "Bytes of one KV block (all layers, K and V).");
  h_->pool_bytes = &NewGauge(r, "kvserve_kv_pool_bytes", "Bytes of the primary KV pool.");
  h_->pool_tokens = &NewGauge(r, "kvserve_kv_pool_tokens",
                              "Tokens the primary KV pool holds (blocks x block size).");
  h_->swap_blocks =
      &NewGauge(r, "kvserve_kv_swap_blocks_capacity", "KV blocks in the host swap pool.");
  h_->cpu_seconds = &NewCounter(r, "process_cpu_seconds_total",
                                "Total user and system CPU time spent in seconds.");
  h_->http_open_connections =
      &NewGauge(r, "kvserve_http_open_connections",
                "HTTP connections currently open, TLS included (not those refused over the cap).");
  h_->http_responses = &prometheus::BuildCounter()
                            .Name("kvserve_http_responses_total")
                            .Help("HTTP responses by status code.")
                            .Register(r);
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::ObserveRequest(const RequestMetrics& m) {
  if (m.ttft_s > 0) h_->ttft->Observe(m.ttft_s);
  if (m.tpot_s > 0) h_->tpot->Observe(m.tpot_s);
  h_->e2e->Observe(m.e2e_s);
  h_->queue_time->Observe(m.queue_s);
  h_->request_prompt_tokens->Observe(m.usage.prompt_tokens);
  h_->request_generation_tokens->Observe(m.usage.completion_tokens);
}

void ServerMetrics::CountHttpResponse(int status) {
  Counter* c;
  {
    absl::MutexLock lock(&h_->http_mu);
    auto [it, inserted] = h_->http_by_code.try_emplace(status, nullptr);
    if (inserted) it->second = &h_->http_responses->Add({{"code", absl::StrCat(status)}});
    c = it->second;
  }
  c->Increment();
}

void ServerMetrics::SetHttpOpenConnections(int open) { h_->http_open_connections->Set(open); }

void ServerMetrics::SetReady(bool ready) { h_->ready->Set(ready ? 1 : 0); }

void ServerMetrics::SetMemory(const RunnerMemoryInfo& m) {
  h_->weight_bytes->Set(static_cast<double>(m.weight_bytes));
  h_->activation_bytes->Set(static_cast<double>(m.activation_bytes));
  h_->block_bytes->Set(static_cast<double>(m.kv_bytes_per_block));
  h_->pool_bytes->Set(static_cast<double>(m.kv_pool_bytes));
  h_->pool_tokens->Set(static_cast<double>(m.kv_pool_tokens));
  h_->swap_blocks->Set(static_cast<double>(m.num_swap_blocks));
}

void ServerMetrics::SetWeightsFingerprint(const std::string& fingerprint) {
  prometheus::BuildGauge()
      .Name("kvserve_model_weights_info")
      .Help("1, labelled with the fingerprint of the served weight files' bytes.")
      .Register(*registry_)
      .Add({{"fingerprint", fingerprint}})
      .Set(1);
}

void ServerMetrics::UpdateLocked(const EngineStats& s) {
  const EngineStats& b = last_;
  if (s.tiers_enabled) {
    if (tiers_ == nullptr) tiers_ = std::make_unique<TierMetrics>(*registry_);
    tiers_->Update(s.tiers, b.tiers);
  }
  h_->queue_length->Set(static_cast<double>(s.num_waiting));
  h_->running->Set(static_cast<double>(s.num_running));
  h_->swapped->Set(static_cast<double>(s.num_swapped));
  h_->tier_loading->Set(static_cast<double>(s.num_tier_loading));
  h_->usage_active->Set(s.kv.active_usage);
  h_->usage_with_cached->Set(s.kv.usage_with_cached);
  h_->blocks_active->Set(static_cast<double>(s.kv.num_active_blocks));
  h_->blocks_cached->Set(static_cast<double>(s.kv.num_cached_blocks));
  h_->blocks_free->Set(static_cast<double>(s.kv.num_free_blocks - s.kv.num_cached_blocks));
  h_->blocks_capacity->Set(static_cast<double>(s.kv.num_blocks));

  Advance(*h_->finished_stop, s.requests_finished_stop, b.requests_finished_stop);
  Advance(*h_->finished_length, s.requests_finished_length, b.requests_finished_length);
  Advance(*h_->finished_cancelled, s.requests_finished_cancelled, b.requests_finished_cancelled);
  Advance(*h_->finished_error, s.requests_finished_error, b.requests_finished_error);
  Advance(*h_->rejected, s.requests_rejected, b.requests_rejected);
  Advance(*h_->prefix_queries, s.kv.prefix_query_tokens, b.kv.prefix_query_tokens);
  Advance(*h_->prefix_hits, s.kv.prefix_hit_tokens, b.kv.prefix_hit_tokens);
  Advance(*h_->preemptions, s.preemptions, b.preemptions);
  Advance(*h_->swap_out, s.kv.swapped_out_blocks, b.kv.swapped_out_blocks);
  Advance(*h_->swap_in, s.kv.swapped_in_blocks, b.kv.swapped_in_blocks);
  Advance(*h_->cow_copies, s.kv.cow_copies, b.kv.cow_copies);
  Advance(*h_->cached_evictions, s.kv.evicted_cached_blocks, b.kv.evicted_cached_blocks);
  for (int i = 0; i < kNumEvictionPolicies; ++i) {
    Advance(*h_->kv_evictions[i], s.kv_evictions[i], b.kv_evictions[i]);
    Advance(*h_->kv_evicted_tokens[i], s.kv_evicted_tokens[i], b.kv_evicted_tokens[i]);
    Advance(*h_->kv_eviction_freed_blocks[i], s.kv_eviction_freed_blocks[i],
            b.kv_eviction_freed_blocks[i]);
  }
  Advance(*h_->steps, s.steps, b.steps);
  Advance(*h_->batched_tokens, s.batched_tokens, b.batched_tokens);
  Advance(*h_->batched_seqs, s.batched_seqs, b.batched_seqs);
  Advance(*h_->prompt_tokens, s.prompt_tokens, b.prompt_tokens);
  Advance(*h_->generation_tokens, s.generated_tokens, b.generated_tokens);
  last_ = s;
}

void ServerMetrics::UpdateCpuLocked() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return;
  const double now = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                     1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  if (now > last_cpu_s_) h_->cpu_seconds->Increment(now - last_cpu_s_);
  last_cpu_s_ = std::max(last_cpu_s_, now);
}

std::string ServerMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

std::string ServerMetrics::Scrape(const EngineStats& stats) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(stats);
  UpdateCpuLocked();
  return Serialize();
}

std::string ServerMetrics::Scrape() {
  absl::MutexLock lock(&mu_);
  UpdateCpuLocked();
  return Serialize();
}

}  // namespace kvserve
