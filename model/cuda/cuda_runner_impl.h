// The insides of CudaModelRunner (model/cuda/cuda_model_runner.h): its Impl,
// the device and pinned buffers it owns and the shapes of its KV pools,
// shared by the files of model/cuda/ that hold the runner's jobs:
//   cuda_model_runner.cc     the public accessors, Synchronize, ReadBlock;
//   cuda_runner_create.cc    Create and CheckDevice, the activations and
//                            workspaces, the profile run, the KV pools,
//                            the device and pinned allocations;
//   cuda_runner_weights.cc   the weight upload (or generation) and the RoPE table;
//   cuda_runner_graphs.cc    the capture of the decode graphs;
//   cuda_runner_forward.cc   Forward: the batch upload, the layer loop, graph replay;
//   cuda_runner_eviction.cc  a step's eviction metadata, slot moves, attention stats;
//   cuda_runner_sampling.cc  Sample and ReadLogits;
//   cuda_runner_copies.cc    block copies, swap, the KV tiers' export and import.
// Only those files include this header. Thread-safety: the runner's (none;
// the engine thread owns it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/format/kv_format.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/cuda/sampling/sample.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/cuda/host/batch_staging.h"
#include "model/cuda/host/device_weight_layout.h"

namespace kvserve {

namespace cuda {
class Gemm;
struct GemmParams;
}  // namespace cuda
class SamplingBatch;

struct DeviceFree {
  void operator()(void* p) const {
    if (p != nullptr) cudaFree(p);
  }
};
struct HostFree {
  void operator()(void* p) const {
    if (p != nullptr) cudaFreeHost(p);
  }
};
using DeviceBuffer = std::unique_ptr<uint8_t, DeviceFree>;
using HostBuffer = std::unique_ptr<uint8_t, HostFree>;

// cudaMalloc and cudaHostAlloc of `bytes` (256 at least); a failure names
// `what` (out of memory: ResourceExhausted).
absl::StatusOr<DeviceBuffer> DeviceAlloc(int64_t bytes, const std::string& what);
absl::StatusOr<HostBuffer> PinnedAlloc(int64_t bytes, const std::string& what,
                                       unsigned flags = cudaHostAllocDefault);

// `n` rounded up to a multiple of 16: the sections of an upload.
inline int64_t Align16(int64_t n) { return (n + 15) / 16 * 16; }

// Where each layer's blocks and tails sit in a pool of `blocks` blocks and
// `tails` tails (see Impl's KV pools).
struct PoolShape {
  int32_t blocks = 0;
  int32_t tails = 0;
  std::vector<int64_t> layer_offset;  // [L] start of layer l's blocks
  std::vector<int64_t> tail_offset;   // [L] start of layer l's tails (-1: none)
  int64_t bytes = 0;
};

// The layout of such a pool for one format per layer.
PoolShape PlanPoolShape(const std::vector<KvFormat>& formats, int32_t blocks, int32_t tails);

// A captured decode step for one batch bucket.
struct GraphStep {
  int32_t bucket = 0;
  GpuAttentionPlanOptions options;  // fixed partition size
  GpuAttentionLaunch launch;        // capacities
  StagingLayout layout;
  cudaGraphExec_t exec = nullptr;
};

struct CudaModelRunner::Impl {
  // ---- configuration ----
  int device = 0;
  ModelConfig config;
  KvFormat format;                // layer 0's (kv_format())
  std::vector<KvFormat> formats;  // one per layer (per-layer cache.kv_dtype lists)
  bool has_tails = false;         // some layer is int4_kc (fp16 tails)
  WeightDtype weight_dtype = WeightDtype::kBf16;
  // fp8_e4m3 linear layers (resolved; the weights' own): PlanDeviceWeights
  // makes them e4m3, Linear quantizes their inputs per token first.
  WeightQuantSpec weight_quant;
  cuda::ActDtype act = cuda::ActDtype::kBf16;
  int64_t elem = 2;
  RunnerOptions options;
  int32_t max_model_len = 0;
  int32_t max_tokens = 0;  // rows of the largest step
  int32_t max_seqs = 0;
  int32_t max_logits_rows = 0;  // == max_seqs
  int32_t max_blocks_per_seq = 0;
  int32_t num_sms = 0;
  int64_t q_dim = 0, kv_dim = 0, qkv_dim = 0;
  GpuAttentionShape attn_shape;
  GpuAttentionPlanOptions eager_options;
  RunnerMemoryInfo info;
  Counters counters;

  // ---- device state ----
  cudaStream_t stream = nullptr;
  cudaEvent_t batch_uploaded = nullptr;
  cudaEvent_t copies_uploaded = nullptr;
  // Swaps run on the copy engines: cudaMemcpy2DAsync on copy_stream, after
  // compute_ready (the compute stream's work so far) and before anything
  // the compute stream enqueues after copies_done.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t compute_ready = nullptr, copies_done = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  DeviceWeightLayout wl;
  DeviceBuffer weights;
  DeviceBuffer rope_cos, rope_sin;
  // Activations.
  DeviceBuffer x;           // [max_tokens][dim] residual stream
  DeviceBuffer h;           // [max_tokens][dim] normed input
  DeviceBuffer qkv;         // [max_tokens][qkv_dim]
  DeviceBuffer attn;        // [max_tokens][q_dim]
  DeviceBuffer gate_up;     // [max_tokens][2 hidden]; SwiGLU writes the first half in place
  DeviceBuffer final_rows;  // [max_logits_rows][dim]
  DeviceBuffer logits;      // [max_logits_rows][vocab] fp32
  // fp8 weights: a GEMM's input as e4m3 codes and its per-row scales.
  DeviceBuffer act_q;      // [max_tokens][largest padded in] bytes
  DeviceBuffer act_scale;  // [max_tokens] fp32
  DeviceBuffer attn_workspace;
  int64_t attn_workspace_bytes = 0;
  // Staging of the batch.
  HostBuffer staging_host;
  DeviceBuffer staging_dev;
  int64_t staging_capacity = 0;
  // Sampling.
  int32_t sample_chunk = 0;  // rows per sampler launch
  DeviceBuffer sample_workspace;
  cuda::SampleWorkspaceLayout sample_ws_layout;
  DeviceBuffer gathered;  // [sample_chunk][vocab] fp32: logits rows shared by samples
  DeviceBuffer results_dev;
  HostBuffer results_host;
  HostBuffer sample_host;
  DeviceBuffer sample_dev;
  int64_t sample_capacity = 0;
  std::unique_ptr<SamplingBatch> sampling;
  std::vector<int32_t> gather_index;
  // Block copies.
  HostBuffer copies_host;
  DeviceBuffer copies_dev;
  int64_t copies_capacity = 0;  // pairs
  // KV pools. Each pool is, layer after layer, [num_blocks][block_bytes of
  // the layer], then, for each layer that keeps tails, [num_tails][tail
  // bytes] (PoolShape). With one format this is cache/format/kv_pages.h's
  // [num_layers][num_blocks][block_bytes].
  DeviceBuffer kv_pool;
  int32_t num_blocks = 0;
  int32_t num_tails = 0;
  PoolShape pool_shape;
  // The host tier's slots (AllocateTierArena): pinned; copies to and from
  // it run on copy_stream, exports recorded by tier_exported.
  HostBuffer tier_arena;
  int64_t tier_arena_bytes = 0;
  cudaEvent_t tier_exported = nullptr;
  HostBuffer swap_host;  // the same layout for the swap pool, pinned + mapped
  uint8_t* swap_dev = nullptr;
  int32_t num_swap_blocks = 0;
  int32_t num_swap_tails = 0;
  PoolShape swap_shape;
  // Graphs.
  std::vector<int32_t> buckets;
  std::map<int32_t, GraphStep> graphs;
  // The last Forward.
  int32_t last_logits_rows = -1;  // real rows; -1: no valid logits

  // ---- KV eviction (cache/eviction/eviction_policy.h) ----
  // A step with sinks, recorded attention or a position past the RoPE table
  // runs eagerly (the decode graphs are captured without them; their device
  // metadata has varying sizes), with its eviction metadata in a second
  // upload (ev_host -> ev_dev) laid out by PlanEviction. Buffers are
  // allocated at the first such step and grown as needed.
  struct Eviction {
    bool active = false;  // RunForward reads the fields below
    bool sinks = false, mass = false, rope_rows = false, sink_rope_rows = false;
    int64_t num_sinks_off = 0, sink_pos_off = 0, mass_offset_off = 0, stats_offset_off = 0,
            rope_off = 0, sink_rope_off = 0;  // byte offsets in ev_dev
    int64_t num_keys = 0;                     // floats of key_mass this step
    int64_t num_stats = 0;                    // floats of stats this step (ReadAttentionStats)
  } ev;
  std::vector<float> inv_freq;  // config.RopeInvFreq(), for positions past the table
  std::vector<uint8_t> ev_scratch;
  HostBuffer ev_host;
  DeviceBuffer ev_dev;
  int64_t ev_capacity = 0;
  cudaEvent_t ev_uploaded = nullptr;
  DeviceBuffer sink_q;         // [max_tokens][qkv_dim]: the q columns, rotated at cache indices
  DeviceBuffer softmax_stats;  // [max_tokens][num_heads][2]
  DeviceBuffer key_mass, attn_stats;
  int64_t key_mass_capacity = 0, attn_stats_capacity = 0;  // floats

  ~Impl();

  uint8_t* Act(const DeviceBuffer& b, int64_t elements) const { return b.get() + elements * elem; }
  uint8_t* Weight(const DeviceMatrix& m) const { return weights.get() + m.offset; }
  PoolShape ShapeFor(int32_t blocks, int32_t tails) const {
    return PlanPoolShape(formats, blocks, tails);
  }

  absl::Status UploadWeights(const LlamaWeights& w);
  absl::Status AllocateActivations();
  absl::Status ProfileRun();
  absl::Status AllocatePools();
  absl::Status CaptureGraphs();
  // Replaces a pinned upload buffer and its device copy with `bytes` of
  // each once the stream is idle (queued work may read the old ones);
  // `capacity` is 0 while they are missing, then `new_capacity` (in the
  // caller's unit).
  absl::Status ReallocateUpload(HostBuffer& host, DeviceBuffer& dev, int64_t& capacity,
                                int64_t new_capacity, int64_t bytes, const char* what);
  absl::Status EnsureSampleCapacity(int64_t bytes);
  absl::Status EnsureCopyCapacity(int64_t pairs);
  absl::Status Upload(const BatchInput& batch, std::span<const int32_t> words,
                      const StagingLayout& layout);
  absl::Status RunForward(const StagingLayout& layout, const GpuAttentionLaunch& launch);
  // y = x W^T through gemm for the weight matrix `w`: an fp8 one first has
  // its input rows quantized (act_q, act_scale) and runs the fp8 GEMM.
  absl::Status Linear(cuda::GemmParams p, const DeviceMatrix& w);
  absl::Status RunCopies(std::span<const BlockCopy> copies, const uint8_t* src,
                         const PoolShape& src_shape, uint8_t* dst, const PoolShape& dst_shape,
                         const char* what);
  // Whether a pool's layers hold blocks of one size, evenly spaced (one 2D
  // copy then moves a block of every layer); false for one layer.
  bool EvenLayers(const PoolShape& pool) const;
  // One block of every layer: in a pool (base + layer_offset[l] + block *
  // block_bytes), or a tier payload (pool null: the layers packed in order).
  struct LayerSpan {
    uint8_t* base;
    const PoolShape* pool;
    int32_t block;
  };
  // Enqueues the copy of one block's layers: one cudaMemcpy2DAsync when the
  // pools' layers are evenly spaced, else one copy a layer.
  absl::Status CopyBlockLayers(const LayerSpan& dst, const LayerSpan& src, cudaMemcpyKind kind,
                               cudaStream_t on);
  // Copies primary blocks to or from tier payloads (ExportBlocks/ImportBlocks):
  // pageable ones on the compute stream, waited for; with `async`, payloads
  // in the tier arena on copy_stream (ordered by events), not waited for.
  absl::Status TierCopies(std::span<const BlockId> blocks, uint8_t* const* host, bool out,
                          bool async, const char* what);
  // Whether a payload of one block lies in the tier arena.
  bool InTierArena(const uint8_t* p) const;
  absl::Status SwapCopies(std::span<const BlockCopy> copies, uint8_t* src, const PoolShape& from,
                          uint8_t* dst, const PoolShape& to, cudaMemcpyKind kind, const char* what);
  absl::Status ForwardBatch(const BatchInput& batch);
  absl::Status PlanEviction(const BatchInput& batch);
  absl::Status RunMoves(std::span<const SlotMove> moves);
  absl::Status SampleRows(std::span<const SampleRow> rows, std::span<SampledToken> out);
};

}  // namespace kvserve
