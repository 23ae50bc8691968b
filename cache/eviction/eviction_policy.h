// cache/eviction/: KV eviction, the choice of which entries a sequence drops
// to stay within a budget: the settings (eviction_params.h), the policies
// and the per-entry statistics they read (eviction_policy.h, this header),
// the learned policy's predictor (learned_evictor.h) and the step-by-step
// driver of one sequence (sequence_evictor.h). KvCacheManager::Evict (cache/)
// carries the choices out; this folder uses cache/ (IndexMove, EvictResult)
// and cache/ never includes it.
//
// KV eviction policies: which entries of a sequence's cache to drop so that
// it keeps a fixed budget of entries and can generate past it. Decisions are
// per sequence (shared by every layer and head), so one block table per
// sequence stays enough; KvCacheManager::Evict carries them out (slot moves,
// blocks back to the pool) and SequenceEvictor (sequence_evictor.h) drives a
// policy step by step.
//
// Policies (cache.eviction_policy, or kv_policy.policy per request):
//   none            keep everything.
//   sliding_window  keep the most recent `budget` entries (Mistral-style
//                   models: budget = config.json's sliding_window).
//   streaming       StreamingLLM: keep the first sink_tokens entries of the
//                   sequence ("attention sinks") and the most recent
//                   budget - sink_tokens. Positions as StreamingLLM assigns
//                   them inside the cache, see below.
//   h2o             Heavy-Hitter Oracle: keep the recent_tokens most recent
//                   entries and, of the others, those with the most
//                   attention accumulated over every step so far.
//   scissorhands    persistence of importance: over the last `history`
//                   steps, count how often each entry got less than the
//                   average attention (1 / entries); drop the most
//                   persistently unimportant first (ties: least accumulated
//                   attention), keeping recent_tokens recent entries.
//   learned         rank entries by a small trained predictor of "needed in
//                   the next steps" (learned_evictor.h); keep recent_tokens.
// The budget counts the entries a decode step attends, its own new entry
// included: after each step's eviction a sequence holds budget - 1 entries.
//
// Positions. Keys are stored after RoPE at the token's absolute position and
// are never rewritten. sliding_window, h2o, scissorhands and learned keep
// absolute positions (queries run at their absolute position). For
// streaming, StreamingLLM assigns in-cache positions: sinks 0 .. s-1, then
// the window in order, so the newest token sits at entries - 1. Because the
// window is contiguous in the text, a query at absolute position p and a
// window key at absolute a are p - a apart both ways: window keys need no
// re-rotation as the window moves. Only the sinks' distance changes: kernels
// score keys at cache indices below num_sinks with a second query, rotated at
// the row's cache index (its StreamingLLM position), instead of at p
// (BatchInput::num_sinks, PagedAttentionParams::sink_q). So a sequence can
// run far past max_position_embeddings while every relative distance the
// model sees stays below the budget.
//   Why not re-rotate kept keys when the window moves: every window key
// would need rotating on every step (all of them shift by one), and with
// quantized pages each dequantize-rotate-requantize adds a rounding error
// that accumulates over thousands of steps; the pages of a shared prefix
// would also stop being shareable. Why not store keys unrotated and rotate
// every key inside the kernel: it costs a rotation per key per head per
// step, needs per-key positions, and splits the prefix cache between
// rotated and unrotated pages. A second query costs one RoPE per row.
//   CUDA backend: its attention kernel takes the same optional sink_q
// [T][num_heads][head_dim] and per-sequence num_sinks and scores keys at
// cache indices < num_sinks[b] with sink_q; RoPE reads host-computed rows
// for positions past its precomputed table.
//
// Thread-safety: policies are immutable and may be shared by every sequence;
// EvictionState is owned by one sequence (engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/eviction/eviction_params.h"
#include "cache/index_move.h"

namespace kvserve {

// Per-entry statistics of one sequence, indexed by cache index and kept in
// step with its cache: Append as entries are written, Observe after each
// forward pass (attention the step's rows paid each entry), Compact after
// KvCacheManager::Evict.
class EvictionState {
 public:
  int32_t size() const { return static_cast<int32_t>(position_.size()); }
  // Absolute position of each entry's token.
  std::span<const int32_t> positions() const { return position_; }
  // Attention accumulated over every observed row: each row gives each
  // entry its softmax weight averaged over query heads and layers (a row's
  // weights sum to 1 over the entries it attends).
  std::span<const float> accumulated() const { return accumulated_; }
  // The last observed step's weight per row (0 for entries it did not see).
  std::span<const float> last() const { return last_; }
  // Bit k: k + 1 observed steps ago the entry got less than the average
  // weight 1 / (entries then); bits of steps before the entry existed are 0.
  std::span<const uint64_t> low_history() const { return low_; }
  // Spread of the last step's weight over layers: standard deviation over
  // layers, times the entries (0 when all layers agree).
  std::span<const float> layer_spread() const { return spread_; }
  // Observed steps.
  int64_t steps() const { return steps_; }

  void Append(std::span<const int32_t> positions);
  // mass: [num_layers][size()] weights summed over the step's `rows` query
  // rows and `num_heads` query heads (ModelRunner::ReadAttentionStats).
  void Observe(std::span<const float> mass, int32_t num_layers, int32_t num_heads, int32_t rows);
  // Applies an eviction: entry m.from moves to m.to, then size becomes
  // new_size.
  void Compact(std::span<const IndexMove> moves, int32_t new_size);
  void Clear();

 private:
  std::vector<int32_t> position_;
  std::vector<float> accumulated_;
  std::vector<float> last_;
  std::vector<uint64_t> low_;
  std::vector<float> spread_;
  int64_t steps_ = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual EvictionPolicyKind kind() const = 0;
  // Whether SelectVictims reads attention statistics (the kernels then
  // record them for the sequence; they cost a little per step).
  virtual bool needs_attention_stats() const = 0;
  // Appends `count` distinct cache indices to drop, 0 < count < size(), in
  // a deterministic order, so that size() - count <= budget - 1 entries stay
  // for the next step to add its own. The newest RecentTokens() - 1 entries
  // (with the next token, RecentTokens() recent ones are attended) and
  // streaming's sinks are never chosen.
  virtual void SelectVictims(const EvictionState& state, const EvictionParams& params,
                             int32_t count, std::vector<int32_t>* victims) const = 0;
};

// The policy of a built-in kind (not none; learned needs a model:
// learned_evictor.h).
std::shared_ptr<const EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind);

namespace internal {
// Shared by the policies: of the entries not protected (the newest
// `recent`, and streaming sinks: positions < sinks), the `count` with the
// lowest (score, position), in that order, appended to *victims.
void LowestScored(const EvictionState& state, std::span<const float> score, int32_t recent,
                  int32_t sinks, int32_t count, std::vector<int32_t>* victims);
}  // namespace internal

}  // namespace kvserve
