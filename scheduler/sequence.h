// Sequence and RequestState: the engine thread's per-sample and per-request
// state.
//
// A request becomes one Sequence (sample 0) at Submit. With n > 1, sample 0
// prefills the prompt alone; when its first token is due, the engine forks
// it (KvCacheManager::Fork, so the prompt's blocks are shared) into samples
// 1 .. n-1, and every sample draws its first token from the same logits.
//
// Seeds: sample i has the seed (request seed + i) mod 2^64: the CPU sampler
// draws from a std::mt19937_64 seeded with it (rng), the GPU sampler from
// Philox keyed by it at counter num_output(). Either way sample i of a seeded
// request produces exactly the tokens a separate n = 1 request with seed
// (seed + i) produces on the same backend. A request without a seed gets a
// fresh random base seed at Submit.
//
// Token bookkeeping: tokens holds prompt + generated ids. num_computed counts
// the leading tokens whose K/V are in the cache; the scheduler runs tokens
// [num_computed, tokens.size()) (decode: exactly one; prefill or recompute:
// possibly in chunks), and a sequence yields a new token in the step whose
// chunk reaches tokens.size(). The last sampled token gets its cache slot
// (KvCacheManager::Append) when it is next scheduled.
//
// Eviction (cache/eviction/eviction_policy.h): a sequence whose request evicts has a
// SequenceEvictor. Its cache then holds fewer entries than computed tokens:
// a newly reserved token's cache index is its index minus cache_offset()
// (the entries dropped so far), while its RoPE position stays its index.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/sequence_evictor.h"
#include "cache/seq_id.h"
#include "model/sampling/sampler_state.h"
#include "scheduler/detokenizer.h"
#include "scheduler/grammar_state.h"
#include "scheduler/request.h"
#include "scheduler/request_stream.h"
#include "scheduler/stop_matcher.h"

namespace kvserve {

enum class SeqStatus : uint8_t { kWaiting, kRunning, kSwapped, kFinished };

struct RequestState;

struct Sequence {
  Sequence(SeqId id, RequestState* request, int32_t index, uint64_t seed,
           const Tokenizer* tokenizer);

  SeqId id;
  RequestState* request;
  int32_t index;                // which of the request's n samples
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t num_computed = 0;     // leading tokens whose K/V are cached
  SeqStatus status = SeqStatus::kWaiting;
  uint64_t seed;
  SamplerState rng;  // the CPU sampler's generator, seeded with `seed`
  Detokenizer detok;
  StopMatcher stop;

  // KV eviction; null under policy none (forks copy their parent's).
  std::unique_ptr<SequenceEvictor> evictor;

  // Constrained decoding; null without a constraint (forks copy their parent's).
  std::unique_ptr<SequenceGrammar> grammar;

  // This step's event for the stream; pushed at the end of the step.
  GenerateOutput out;
  bool has_out = false;

  int32_t prompt_len() const;
  int32_t num_output() const { return static_cast<int32_t>(tokens.size()) - prompt_len(); }
  std::span<const int32_t> prompt() const { return {tokens.data(), size_t(prompt_len())}; }
  std::span<const int32_t> output() const {
    return {tokens.data() + prompt_len(), size_t(num_output())};
  }
  // Tokens still to run through the model (>= 1 for a live sequence).
  int32_t num_uncomputed() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
  bool finished() const { return status == SeqStatus::kFinished; }
  // Token index minus cache index for the tokens the cache reserves next.
  int32_t cache_offset() const {
    return evictor ? static_cast<int32_t>(evictor->num_evicted()) : 0;
  }
};

// Order of service: lower priority value first, then (with per-client
// fairness) lower client rank, then earlier arrival, then lower sample index.
// Preemption picks victims from the other end.
inline bool ServedBefore(const Sequence* a, const Sequence* b);

struct RequestState {
  std::string id;
  GenerateRequest params;  // prompt text dropped; prompt ids below
  std::shared_ptr<RequestStream> stream;
  uint64_t arrival = 0;  // submission order
  // With per-client fairness: how many of its client's requests were live
  // when it was admitted (0 for a client's first), so clients take turns;
  // always 0 without fairness.
  int32_t client_rank = 0;
  uint64_t seed_base = 0;  // sample i uses seed_base + i
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> stop_ids;  // EOS/BOS (unless ignore_eos) + stop_token_ids
  // KV eviction of every sample (policy none: no policy).
  EvictionParams eviction;
  std::shared_ptr<const EvictionPolicy> policy;
  std::shared_ptr<const CompiledGrammar> grammar;  // params.constraint compiled; or null
  int32_t hold_limit = 0;  // entries a sample may hold after a step's append
  std::vector<std::unique_ptr<Sequence>> samples;  // 1 until forked, then n
  bool forked = false;
  int32_t num_live = 0;  // samples not yet finished
  Usage usage;
  bool cached_counted = false;  // usage.cached_prompt_tokens set at first admission
  bool in_step = false;         // has events to push this step
  bool done = false;
  FinishReason finish_reason = FinishReason::kNone;  // of the sample that ended last
  std::string error;

  // Timings for RequestMetrics.
  absl::Time submit_time;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  absl::Time last_token = absl::InfinitePast();
  int64_t token_steps = 0;  // steps that produced at least one token
};

inline bool ServedBefore(const Sequence* a, const Sequence* b) {
  if (a->request->params.priority != b->request->params.priority) {
    return a->request->params.priority < b->request->params.priority;
  }
  if (a->request->client_rank != b->request->client_rank) {
    return a->request->client_rank < b->request->client_rank;
  }
  if (a->request->arrival != b->request->arrival) {
    return a->request->arrival < b->request->arrival;
  }
  return a->index < b->index;
}

inline int32_t Sequence::prompt_len() const {
  return static_cast<int32_t>(request->prompt_ids.size());
}

}  // namespace kvserve
