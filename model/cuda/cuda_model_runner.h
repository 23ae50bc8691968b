// CudaModelRunner: the CUDA backend of ModelRunner, on one device.
//
// Memory (all allocated once, in Create, in this order):
//   weights     one allocation in model.dtype (model/cuda/host/device_weight_layout.h):
//               fused wqkv and w_gate_up, uploaded from any loader's fp32
//               LlamaWeights through pinned chunks and converted on the
//               device, or generated in place for a dummy model loaded as
//               shapes (no host copy of an 8B model), with a progress line
//               on stderr above 1 GiB;
//   activations sized for the largest step (max_num_batched_tokens rows,
//               max_num_seqs logits rows), the cuBLASLt workspace, the
//               attention split-KV workspace, the sampler's workspace, and
//               the staging buffers; then a profile forward at the largest
//               batch (plus sampling and a block copy) on a temporary pool,
//               so every lazy allocation has happened: the free memory then
//               is what the KV pool may take (cache/sizing/kv_pool_plan.h);
//   KV pool     one cudaMalloc (never managed memory), zeroed: each
//               layer's [num_blocks][block_bytes of its format] (a block
//               reads the same on the CPU; one format gives cache/format/kv_pages.h's
//               [num_layers][num_blocks][block_bytes]), then for int4_kc
//               layers [num_tails][tail_block_bytes] of fp16 tails;
//   swap pool   cache.num_swap_blocks blocks (and as many tails as the
//               device pool) of pinned, mapped host memory, same layout;
//   graphs      one CUDA graph per decode batch bucket (model/cuda/host/graph_buckets.h)
//               when model.cuda_graphs.
//
// One step runs on one stream, in order: the block copies (one launch per
// batch, kernels/cuda/kv/copy_blocks.h), the BatchInput upload (one pinned
// buffer, one cudaMemcpyAsync, model/cuda/host/batch_staging.h), the forward pass,
// and (in Sample) the sampling upload, the sampler and the download of the
// tokens. Sample and ReadLogits wait for the device; Forward and the copies
// only wait for the previous upload to have left its pinned buffer, so the
// host can build step n + 1 while the device runs step n.
//
// Forward, per layer: RMSNorm -> QKV GEMM (+ bias) -> [q/k RMSNorm] -> RoPE
// -> KV write -> paged attention (int4_kc layers: seal full blocks ->
// attention over sealed blocks + tail -> tail write, kernels/cuda/
// kv_write_kc.h) -> O GEMM accumulating into the residual
// (+ bias) -> RMSNorm -> gate_up GEMM -> SwiGLU (in place) -> down GEMM
// accumulating into the residual. Then the logits rows are gathered, normed
// and multiplied by the LM head into fp32 logits [rows][vocab] that stay on
// the device. A pure decode step whose batch fits a bucket replays that
// bucket's graph over metadata padded to the bucket (fixed addresses);
// prefill and mixed steps run eagerly.
//
// Errors: a missing device, an ordinal past the last device, a model the
// kernels cannot run (head_dim, vocabulary) are start-up errors naming the
// key; running out of device memory is ResourceExhausted naming what was
// being allocated.
//
// Thread-safety: none; the engine thread owns the runner. Every call makes
// the runner's device current on the calling thread.
//
// The code: one file of model/cuda/ per job (create and pools, weights,
// graphs, forward, eviction, sampling, copies) around the Impl of
// model/cuda/cuda_runner_impl.h, which lists them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"
#include "model/runner_factory.h"

namespace kvserve {

class CudaModelRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(LlamaWeights weights,
                                                                 const RunnerOptions& options,
                                                                 const DeviceSpec& device,
                                                                 WeightDtype dtype);
  ~CudaModelRunner() override;

  // FailedPrecondition naming model.device when there is no CUDA device or
  // no device `device.ordinal`.
  static absl::Status CheckDevice(const RunnerOptions& options, const DeviceSpec& device);

  const ModelConfig& config() const override;
  const KvFormat& kv_format() const override;
  const KvFormat& layer_kv_format(int layer) const override;
  int32_t num_blocks() const override;
  int32_t num_swap_blocks() const override;
  // int4_kc layers (cache.kv_dtype int4_kc, alone or in a per-layer list):
  // fp16 tails, two per sequence slot in each pool (as the CPU runner).
  int32_t num_tail_blocks() const override;
  bool partial_rows_in_blocks() const override;
  int32_t num_swap_tail_blocks() const override;
  const RunnerMemoryInfo& memory_info() const override;

  using ModelRunner::Forward;
  absl::Status Forward(const BatchInput& batch) override;
  absl::Status Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) override;
  absl::Status ReadLogits(std::span<float> logits) override;
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override;
  absl::Status SwapOut(std::span<const BlockCopy> copies) override;
  absl::Status SwapIn(std::span<const BlockCopy> copies) override;
  // KV eviction (model_runner.h): every per-token format (int4_kc is refused
  // at Create). Eviction steps (sinks, recorded attention, positions past the
  // RoPE table) run eagerly, never from a decode graph.
  bool supports_eviction() const override;
  absl::Status MoveSlots(std::span<const SlotMove> moves) override;
  // KV tiers (cache/tier/): whole primary blocks of every layer to and from
  // host bytes (model_runner.h's layout). The host tier's slots live in one
  // pinned arena (AllocateTierArena, cudaHostAlloc): copies to and from it
  // run on the copy stream, after the compute stream's work so far and
  // before what it enqueues next (events), and return at once (exports:
  // FinishExports waits). Other host bytes (pageable) are copied on the
  // compute stream and waited for. Tail ids are refused (tiers hold full
  // blocks).
  bool supports_kv_tiers() const override { return true; }
  // Token masks: applied on the device to a private copy of each masked
  // row's logits before the sampling kernel (kernels/cuda/sampling/token_mask.h).
  bool supports_token_masks() const override { return true; }
  int64_t tier_block_bytes() const override;
  absl::Status ExportBlocks(std::span<const BlockId> blocks, std::span<uint8_t> out) override;
  absl::Status ImportBlocks(std::span<const BlockId> blocks,
                            std::span<const uint8_t* const> in) override;
  absl::StatusOr<std::span<uint8_t>> AllocateTierArena(int64_t bytes) override;
  absl::Status ExportBlocksTo(std::span<const BlockId> blocks,
                              std::span<uint8_t* const> out) override;
  absl::Status FinishExports() override;
  absl::Status ReadAttentionStats(std::span<float> out) override;

  // For tests and benchmarks.
  struct Counters {
    int64_t eager_steps = 0;
    int64_t graph_steps = 0;
  };
  const Counters& counters() const;
  // The GEMM plans (kernels/cuda/layers/gemm.h): shapes, shapes whose
  // algorithm this runner picked by timing, shapes that took an earlier
  // runner's pick, and row counts that run an algorithm of their own.
  struct GemmStats {
    int64_t shapes = 0, tuned = 0, memo_hits = 0, invariance_fallbacks = 0;
  };
  GemmStats gemm_stats() const;
  // The decode batch sizes with a captured graph (empty with graphs off).
  const std::vector<int32_t>& graph_buckets() const;
  // Waits for the stream; the first asynchronous error, if any.
  absl::Status Synchronize();
  // One block of one layer of the device pool, copied to the host.
  absl::StatusOr<std::vector<uint8_t>> ReadBlock(int layer, int32_t block);

 private:
  struct Impl;
  explicit CudaModelRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve
