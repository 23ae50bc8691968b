// ModelRunner: runs a model over one BatchInput per step against the paged KV
// cache it owns (host memory for the CPU backend, device memory for CUDA),
// and samples the next tokens where the logits live. The scheduler decides
// the batch and hands out block ids; the runner only reads and writes the
// blocks the batch names.
//
// One step, as the engine drives it:
//   CopyBlocks / SwapOut / SwapIn   the cache manager's copies, in that order
//   Forward(batch)                  K/V written, logits of batch.logits_rows
//                                   kept inside the runner (on the device for
//                                   CUDA; the call may return before the work
//                                   is done)
//   Sample(rows, out)               one token per SampleRow from those logits;
//                                   only tokens and requested logprobs come
//                                   back to the host
// Several SampleRows may name the same logits row: the n samples of a request
// draw their first token from the one row its prompt produced, each with its
// own generator. Tools that need whole logits rows (eval-kv, tests) call
// Forward(batch, logits), which is Forward then ReadLogits.
//
// Determinism: greedy rows (temperature 0) give the same token on every
// backend for the same logits. Random draws use the backend's generator: the
// CPU's std::mt19937_64 per sequence (SampleRow::state, see model/sampling/sampler.h),
// the GPU's Philox keyed by SampleRow::seed at counter output.size(); both
// depend only on the sequence, never on what it is batched with.
//
// Errors: a malformed batch is InvalidArgument naming the field, before any
// K/V is written. Copies and device work return their status (a device copy
// can fail); a block id outside its pool is the caller's broken invariant
// and aborts.
//
// Thread-safety: none; the engine thread owns the runner.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_copy.h"
#include "cache/block_pool.h"
#include "cache/format/kv_format.h"
#include "kernels/batch_input.h"
#include "model/model_config.h"
#include "model/runner_memory_info.h"
#include "model/sampling/sampling_params.h"

namespace kvserve {

struct SamplerState;  // model/sampling/sampler.h

// One token to draw from the logits of the last Forward.
struct SampleRow {
  // Index into the last batch's logits_rows (not a token row).
  int32_t logits_index = 0;
  const SamplingParams* params = nullptr;  // validated; must outlive Sample
  // The sequence's tokens so far, for the penalties.
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  // CPU sampling: the sequence's generator (advanced by a non-greedy draw).
  SamplerState* state = nullptr;
  // Device sampling: the sequence's Philox key; the counter is output.size().
  uint64_t seed = 0;
  // -1: no logprobs; else the chosen token's raw logprob and this many
  // alternatives (<= kMaxSampleLogprobs).
  int32_t num_logprobs = -1;
  // Constrained decoding: empty, or a bitset of the tokens allowed
  // (ceil(vocab / 32) words; bit id % 32 of word id / 32), the layout a
  // sampling kernel can read per row. Disallowed tokens are never drawn;
  // logprobs stay the model's raw ones.
  std::span<const uint32_t> allowed;
};

inline constexpr int32_t kMaxSampleLogprobs = 20;

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                        // when num_logprobs >= 0
  std::vector<std::pair<int32_t, float>> top;  // best first; capacity is reused
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const KvFormat& kv_format() const = 0;
  // Layer l's KV format (kv_format() is layer 0's; they differ where
  // cache.kv_dtype is a per-layer list).
  virtual const KvFormat& layer_kv_format(int layer) const {
    (void)layer;
    return kv_format();
  }
  // Blocks in the device (primary) pool and in the host swap pool.
  virtual int32_t num_blocks() const = 0;
  virtual int32_t num_swap_blocks() const = 0;
  // int4_kc: full-precision tail blocks for partial blocks, in the primary
  // and in the swap pool (0: no layer keeps tails). Copies name them with
  // extended ids (cache/block_copy.h); BatchInput::tail_ids names a
  // sequence's tail.
  virtual int32_t num_tail_blocks() const { return 0; }
  virtual int32_t num_swap_tail_blocks() const { return 0; }
  // With tails: whether some layer keeps a partial block's rows in the block
  // itself (a layer without tails), so copy-on-write must copy the block.
  virtual bool partial_rows_in_blocks() const { return false; }
  virtual const RunnerMemoryInfo& memory_info() const = 0;

  // Writes the K/V of every row of `batch` into its slot and computes the
  // logits of the rows batch.logits_rows names; they stay in the runner
  // until the next Forward.
  virtual absl::Status Forward(const BatchInput& batch) = 0;
  // One token per row from the last Forward's logits; out.size() must be
  // rows.size(). out[i].top is filled only when rows[i].num_logprobs > 0.
  virtual absl::Status Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) = 0;
  // The last Forward's raw logits, logits[i * vocab_size ...] for
  // logits_rows[i]; logits.size() must be at least logits_rows.size() * vocab.
  virtual absl::Status ReadLogits(std::span<float> logits) = 0;

  // Forward, then ReadLogits (tools and tests).
  absl::Status Forward(const BatchInput& batch, std::span<float> logits);

  // Batched block copies inside the primary pool (copy-on-write).
  virtual absl::Status CopyBlocks(std::span<const BlockCopy> copies) = 0;

  // ---- KV eviction (cache/eviction/eviction_policy.h) --------------------------------
  // Whether the backend implements MoveSlots, ReadAttentionStats and
  // BatchInput's num_sinks / attention_stats; the engine refuses eviction
  // policies otherwise. The CPU runner does for every format but int4_kc;
  // the CUDA runner for one per-token format in every layer (a slot-move
  // kernel, the attention kernel's optional sink query and per-key mass
  // output with the contract of kernels/cpu/attention/paged_attention.h, and RoPE at
  // positions past its table).
  virtual bool supports_eviction() const { return false; }
  // Runs eviction's slot moves (StepCopies::slot_moves, after the other
  // copies): each copies one token's K/V, every layer, scales included.
  virtual absl::Status MoveSlots(std::span<const SlotMove> moves);
  // The attention statistics of the last Forward: for each sequence b with
  // batch.attention_stats[b] set, in batch order, [num_layers][context_len[b]]
  // floats: the softmax weight each cache entry got, summed over the
  // sequence's rows of the step and over query heads. out.size() must be at
  // least the total.
  virtual absl::Status ReadAttentionStats(std::span<float> out);
  // Primary pool -> swap pool (src is a primary id, dst a swap id) and back.
  virtual absl::Status SwapOut(std::span<const BlockCopy> copies) = 0;
  virtual absl::Status SwapIn(std::span<const BlockCopy> copies) = 0;

  // Whether Sample applies SampleRow::allowed token masks (constrained
  // decoding); the engine refuses constraints otherwise.
  virtual bool supports_token_masks() const { return false; }

  // ---- Tiers below the device pool (cache/tier/) ------------------------------
  // Whether ExportBlocks/ImportBlocks work; the engine refuses tier settings
  // otherwise.
  virtual bool supports_kv_tiers() const { return false; }
  // Bytes of one primary block in every layer, as stored (scales inside):
  // layer 0's block bytes, then layer 1's, ... (a tier value's payload).
  virtual int64_t tier_block_bytes() const { return 0; }
  // Copies whole primary blocks out to host bytes, out: [blocks.size()]
  // [tier_block_bytes()], and back in from one payload per block. One call
  // per step each (the engine batches a step's spills and loads); the
  // caller's ordering contract is cache/kv_tier_hooks.h's.
  virtual absl::Status ExportBlocks(std::span<const BlockId> blocks, std::span<uint8_t> out);
  virtual absl::Status ImportBlocks(std::span<const BlockId> blocks,
                                    std::span<const uint8_t* const> in);
  // Host memory for the host tier's slots that this runner copies to and
  // from without staging (CUDA: one pinned arena), owned by the runner until
  // it is destroyed; empty when it has none (the tier allocates its own).
  // Once, before any transfer.
  virtual absl::StatusOr<std::span<uint8_t>> AllocateTierArena(int64_t bytes) {
    (void)bytes;
    return std::span<uint8_t>();
  }
  // ExportBlocks to one payload address per block. When every address lies
  // in the tier arena it may return before the copies are done (the device
  // work enqueued after it, which may overwrite the blocks, is ordered after
  // them) and FinishExports waits for them; otherwise they are done at return.
  // ImportBlocks from the arena may likewise run asynchronously, ordered
  // before the next forward pass; its payloads must stay unchanged until
  // then (the host tier pins the slots it hands out).
  virtual absl::Status ExportBlocksTo(std::span<const BlockId> blocks,
                                      std::span<uint8_t* const> out);
  virtual absl::Status FinishExports() { return absl::OkStatus(); }
};

inline absl::Status ModelRunner::ExportBlocksTo(std::span<const BlockId> blocks,
                                                std::span<uint8_t* const> out) {
  const size_t per = static_cast<size_t>(tier_block_bytes());
  for (size_t i = 0; i < blocks.size(); ++i) {
    absl::Status s = ExportBlocks(blocks.subspan(i, 1), std::span<uint8_t>(out[i], per));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

inline absl::Status ModelRunner::ExportBlocks(std::span<const BlockId>, std::span<uint8_t>) {
  return absl::UnimplementedError("this backend does not support KV tiers");
}

inline absl::Status ModelRunner::ImportBlocks(std::span<const BlockId>,
                                              std::span<const uint8_t* const>) {
  return absl::UnimplementedError("this backend does not support KV tiers");
}

inline absl::Status ModelRunner::MoveSlots(std::span<const SlotMove>) {
  return absl::UnimplementedError("this backend does not support KV eviction (slot moves)");
}

inline absl::Status ModelRunner::ReadAttentionStats(std::span<float>) {
  return absl::UnimplementedError("this backend does not support KV eviction (attention stats)");
}

inline absl::Status ModelRunner::Forward(const BatchInput& batch, std::span<float> logits) {
  const size_t want = batch.logits_rows.size() * static_cast<size_t>(config().vocab_size);
  if (logits.size() < want) {
    return absl::InvalidArgumentError("logits buffer has " + std::to_string(logits.size()) +
                                      " floats, the batch needs " + std::to_string(want));
  }
  absl::Status s = Forward(batch);
  if (!s.ok()) return s;
  return ReadLogits(logits);
}

}  // namespace kvserve
