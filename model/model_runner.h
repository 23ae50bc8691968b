// ModelRunner: runs a model over one BatchInput per step against the paged KV
// cache it owns (host memory for the CPU backend, device memory for CUDA).
// The scheduler decides the batch and hands out block ids; the runner only
// reads and writes the blocks the batch names.
//
// Thread-safety: none; the engine thread owns the runner.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "cache/block_copy.h"
#include "cache/block_pool.h"
#include "cache/kv_format.h"
#include "kernels/batch_input.h"
#include "model/model_config.h"

namespace kvserve {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const KvFormat& kv_format() const = 0;
  // Blocks in the device (primary) pool and in the host swap pool.
  virtual int32_t num_blocks() const = 0;
  virtual int32_t num_swap_blocks() const = 0;
  // int4_kc: full-precision tail blocks for partial blocks, in the primary
  // and in the swap pool (0: no layer keeps tails). Copies name them with
  // extended ids (cache/block_copy.h); BatchInput::tail_ids names a
  // sequence's tail.
  virtual int32_t num_tail_blocks() const { return 0; }
  virtual int32_t num_swap_tail_blocks() const { return 0; }

  // Writes the K/V of every row of `batch` into its slot, then fills
  // logits[i * vocab_size ...] for row batch.logits_rows[i].
  // logits.size() must be at least logits_rows.size() * vocab_size.
  virtual absl::Status Forward(const BatchInput& batch, std::span<float> logits) = 0;

  // Batched block copies inside the primary pool (copy-on-write).
  virtual void CopyBlocks(std::span<const BlockCopy> copies) = 0;
  // Primary pool -> swap pool (src is a primary id, dst a swap id) and back.
  virtual void SwapOut(std::span<const BlockCopy> copies) = 0;
  virtual void SwapIn(std::span<const BlockCopy> copies) = 0;
};

}  // namespace kvserve
