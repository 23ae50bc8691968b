// CpuModelRunner: the CPU backend of ModelRunner. It owns the model weights,
// the primary KV pool (host memory, [num_layers][num_blocks][block_bytes])
// and a second host pool that preempted sequences are swapped into; block
// ids of both come from the caller's BlockPools.
//
// Example:
//   KV_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(path));
//   CpuRunnerOptions opt;
//   opt.block_size = 16;
//   opt.num_blocks = 64;
//   KV_ASSIGN_OR_RETURN(auto runner, CpuModelRunner::Create(std::move(m.weights), opt));
//   KV_RETURN_IF_ERROR(runner->Forward(batch, logits));   // or Forward(batch) + Sample(rows, out)
//
// Thread-safety: none; the engine thread owns the runner (Forward may use a
// private thread pool internally).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/format/kv_dtype_spec.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "model/cpu/cpu_forward.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"
#include "model/sampling/host_sampling.h"

namespace kvserve {

struct CpuRunnerOptions {
  // One dtype, or one per layer (kv_dtype_spec.h).
  KvDtypeSpec kv_dtype = KvDtype::kFp32;
  int block_size = 16;
  // Primary pool size; 0 means enough blocks for one sequence of
  // max_position_embeddings tokens.
  int32_t num_blocks = 0;
  int32_t num_swap_blocks = 0;
  int int4_group_size = 64;
  // int4_kc tails (fp32 on the CPU): 0 means kDefaultTailBlocks when a layer
  // keeps tails; swap tails, 0: as many as tails when num_swap_blocks > 0.
  int32_t num_tail_blocks = 0;
  int32_t num_swap_tail_blocks = 0;
  // Threads of the forward pass, the caller included; <= 0: one per hardware thread.
  int num_threads = 0;
  // For memory_info(): which setting the pool size came from.
  std::string pool_sized_from = "cache.num_blocks";
  // cache.low_rank: pages of rank-R latents (model/lowrank/low_rank_kv.h),
  // checked against the weights by the caller (LoadLowRankKvFor). Not with
  // int4_kc layers; no eviction and no KV tiers with it.
  std::shared_ptr<const LowRankKv> low_rank;
  // cache.cross_layer (cache/format/kv_cross_layer.h): pairs of layers share
  // one stored direction per token. Per-token kv_dtypes only; not with
  // low_rank; no eviction and no KV tiers with it.
  KvCrossLayerSpec cross_layer;
};

class CpuModelRunner final : public ModelRunner {
 public:
  static constexpr int32_t kDefaultTailBlocks = 128;

  // Takes the weights (their storage stays alive with the runner). Copying a
  // LlamaWeights is cheap (its tensors are views on shared storage), so
  // several runners may share one loaded model.
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(LlamaWeights weights,
                                                                const CpuRunnerOptions& options);

  const ModelConfig& config() const override { return model_->config(); }
  const KvFormat& kv_format() const override { return primary_.format(); }
  const KvFormat& layer_kv_format(int layer) const override { return primary_.format(layer); }
  int32_t num_blocks() const override { return primary_.num_blocks(); }
  int32_t num_swap_blocks() const override { return swap_.num_blocks(); }
  int32_t num_tail_blocks() const override { return primary_.num_tails(); }
  int32_t num_swap_tail_blocks() const override { return swap_.num_tails(); }
  bool partial_rows_in_blocks() const override;
  const RunnerMemoryInfo& memory_info() const override { return memory_info_; }

  using ModelRunner::Forward;
  absl::Status Forward(const BatchInput& batch) override;
  // The CPU Sampler over the logits of the last Forward (HostRowSampler).
  absl::Status Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) override;
  absl::Status ReadLogits(std::span<float> logits) override;
  // Host memcpy; never fails. Aborts on a block id outside its pool (the
  // scheduler's broken invariant).
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override;
  absl::Status SwapOut(std::span<const BlockCopy> copies) override;
  absl::Status SwapIn(std::span<const BlockCopy> copies) override;
  // Eviction moves single token rows: not with int4_kc's per-block K scales.
  // Nor with low-rank pages (keys sit at their cache index).
  bool supports_eviction() const override { return !primary_.has_tails() && !low_rank(); }
  // Host memcpy of each token's rows; aborts on a slot outside the pool.
  absl::Status MoveSlots(std::span<const SlotMove> moves) override;
  absl::Status ReadAttentionStats(std::span<float> out) override;
  // Tiers: host memcpy of whole blocks, every layer; aborts on a block id
  // outside the pool or a buffer of the wrong size.
  // Not with low-rank pages: a tier's identity does not carry the bases.
  // Nor with cross-layer pages (a tier's identity does not carry the setting).
  bool supports_kv_tiers() const override {
    return !low_rank() && !model_->cross_layer().enabled();
  }
  bool supports_token_masks() const override { return true; }
  int64_t tier_block_bytes() const override { return primary_.bytes_per_block(); }
  absl::Status ExportBlocks(std::span<const BlockId> blocks, std::span<uint8_t> out) override;
  absl::Status ImportBlocks(std::span<const BlockId> blocks,
                            std::span<const uint8_t* const> in) override;

  // The host pages, for tests and tools that inspect the cache.
  const HostKvPages& primary_pages() const { return primary_; }
  const HostKvPages& swap_pages() const { return swap_; }
  int num_threads() const { return model_->num_threads(); }
  const LowRankKv* low_rank() const { return model_->low_rank(); }

 private:
  CpuModelRunner(std::unique_ptr<CpuForward> model, const std::vector<KvFormat>& formats,
                 int32_t num_blocks, int32_t num_swap_blocks, int32_t num_tails,
                 int32_t num_swap_tails, const std::string& pool_sized_from);

  std::unique_ptr<CpuForward> model_;
  HostKvPages primary_;
  HostKvPages swap_;
  RunnerMemoryInfo memory_info_;
  std::vector<float> logits_;  // [logits rows of the last Forward][vocab]
  HostRowSampler sampler_;
};

}  // namespace kvserve
