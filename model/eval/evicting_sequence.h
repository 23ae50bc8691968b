// EvictingSequence: one sequence fed a token stream through a ModelRunner's
// paged cache under an eviction policy, exactly as the engine drives an
// evicting sequence (SequenceEvictor decides, KvCacheManager::Evict carries
// out, the copies and slot moves run before the next step). The tools that
// study eviction (eval-kv's long-text study, train-evictor) and the tests use
// it; policy none runs the same path without evicting.
//
// Each Step computes the next tokens of the stream (teacher forcing) at their
// absolute positions and returns the logits of every row; the caller picks
// the step sizes (SequenceEvictor::StepRows gives the engine's).
//
// Example:
//   EvictingSequence seq(runner, policy, params, /*hold_limit=*/params.budget);
//   for (int32_t t = 0; t + 1 < n;) {
//     const int32_t rows = seq.StepRows(prompt_left);
//     KV_RETURN_IF_ERROR(seq.Step(stream, t, t + rows, &logits));
//     t += rows;
//   }
//
// Thread-safety: none; drives the runner from the calling thread. The
// sequence owns every block of the runner's pool while it lives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/sequence_evictor.h"
#include "cache/kv_cache_manager.h"
#include "kernels/batch_input.h"
#include "model/model_runner.h"

namespace kvserve {

class EvictingSequence {
 public:
  // policy null (or params.policy none): no eviction; hold_limit is then
  // ignored. Otherwise params must be valid for it.
  EvictingSequence(ModelRunner& runner, std::shared_ptr<const EvictionPolicy> policy,
                   const EvictionParams& params, int32_t hold_limit);

  // Runs stream[begin, end), where begin is the number of tokens computed so
  // far. Fills *logits with [end - begin][vocab]. An error leaves the
  // sequence unusable (Reset it).
  absl::Status Step(std::span<const int32_t> stream, int32_t begin, int32_t end,
                    std::vector<float>* logits);
  // The engine's step size for the next step with prompt_left prompt tokens
  // still to compute (no eviction: all of them, at least 1).
  int32_t StepRows(int32_t prompt_left) const;
  // Frees every block; the next Step starts a new stream at 0.
  void Reset();

  int32_t computed() const { return computed_; }
  int32_t cache_len() const;
  // The evictor (nullptr without eviction), for its statistics.
  const SequenceEvictor* evictor() const { return evictor_ ? &*evictor_ : nullptr; }
  const KvCacheManager& kv() const { return kv_; }
  // Blocks the sequence held at most so far (after any step's append).
  int32_t max_blocks_held() const { return max_blocks_; }

 private:
  static constexpr SeqId kSeq = 1;
  absl::Status RunCopies();

  ModelRunner& runner_;
  KvCacheManager kv_;
  std::optional<SequenceEvictor> evictor_;
  std::optional<SequenceEvictor> fresh_;  // for Reset
  BatchInput batch_;
  std::vector<float> stats_;
  std::vector<int32_t> positions_;
  int32_t computed_ = 0;
  int32_t max_blocks_ = 0;
};

}  // namespace kvserve
