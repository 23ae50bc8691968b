#include "model/cuda/cuda_model_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "cache/kv_format.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "cache/sizing/kv_pool_plan.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/act_dtype.h"
#include "kernels/cuda/copy_blocks.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_write.h"
#include "kernels/cuda/kv_write_kc.h"
#include "kernels/cuda/move_slots.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_kc.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/token_mask.h"
#include "kernels/cuda/weight_init.h"
#include "kernels/gpu_attention_plan.h"
#include "kernels/paged_view.h"
#include "kernels/random_weights.h"
#include "kernels/sample_rows.h"
#include "kernels/sampling_batch.h"
#include "model/batch_check.h"
#include "model/cuda/host/batch_staging.h"
#include "model/cuda/host/device_weight_layout.h"
#include "model/cuda/host/graph_buckets.h"
#include "model/sampling/host_sampling.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::ActDtype;
using cuda::CudaStatus;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;
// Weights are uploaded through two pinned buffers of this many floats.
constexpr int64_t kUploadChunkFloats = int64_t{16} << 20;  // 64 MiB
// Kept free beside the KV pool: graph instantiation, the driver's own
// growth, fragmentation.
constexpr int64_t kReserveBytes = 512 * kMiB;

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

absl::StatusOr<DeviceBuffer> DeviceAlloc(int64_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, absl::StrCat("cudaMalloc of ", bytes, " bytes for ", what).c_str());
  }
  return DeviceBuffer(static_cast<uint8_t*>(p));
}

absl::StatusOr<HostBuffer> PinnedAlloc(int64_t bytes, const std::string& what,
                                       unsigned flags = cudaHostAllocDefault) {
  void* p = nullptr;
  const cudaError_t e =
      cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)), flags);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, absl::StrCat("cudaHostAlloc of ", bytes, " bytes for ", what).c_str());
  }
  return HostBuffer(static_cast<uint8_t*>(p));
}

ActDtype ToAct(WeightDtype d) {
  switch (d) {
    case WeightDtype::kFp16:
      return ActDtype::kFp16;
    case WeightDtype::kBf16:
      return ActDtype::kBf16;
    case WeightDtype::kFp32:
    default:
      return ActDtype::kFp32;
  }
}

// Prints "\rlabel 42% (1.2 / 15.0 GiB)" on stderr for totals above 1 GiB.
class Progress {
 public:
  Progress(const char* label, int64_t total) : label_(label), total_(total) {}
  void Add(int64_t bytes) {
    done_ += bytes;
    if (total_ < kGiB) return;
    const int percent = static_cast<int>(done_ * 100 / std::max<int64_t>(total_, 1));
    if (percent == last_) return;
    last_ = percent;
    std::fprintf(stderr, "\rkvserve: %s %3d%% (%.1f / %.1f GiB)", label_, percent,
                 static_cast<double>(done_) / kGiB, static_cast<double>(total_) / kGiB);
    if (done_ >= total_) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  const char* label_;
  int64_t total_;
  int64_t done_ = 0;
  int last_ = -1;
};

}  // namespace

// Where each layer's blocks and tails sit in a pool of `blocks` blocks and
// `tails` tails (see Impl's KV pools).
struct PoolShape {
  int32_t blocks = 0;
  int32_t tails = 0;
  std::vector<int64_t> layer_offset;  // [L] start of layer l's blocks
  std::vector<int64_t> tail_offset;   // [L] start of layer l's tails (-1: none)
  int64_t bytes = 0;
};

static PoolShape PlanPoolShape(const std::vector<KvFormat>& formats, int32_t blocks,
                               int32_t tails) {
  PoolShape p;
  p.blocks = blocks;
  p.tails = tails;
  int64_t off = 0;
  for (const KvFormat& f : formats) {
    p.layer_offset.push_back(off);
    off += int64_t{blocks} * f.block_bytes();
  }
  for (const KvFormat& f : formats) {
    p.tail_offset.push_back(f.has_tails() && tails > 0 ? off : -1);
    if (f.has_tails()) off += int64_t{tails} * f.tail_block_bytes();
  }
  p.bytes = off;
  return p;
}

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
  ActDtype act = ActDtype::kBf16;
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
  // bytes] (PoolShape). With one format this is cache/kv_pages.h's
  // [num_layers][num_blocks][block_bytes].
  DeviceBuffer kv_pool;
  int32_t num_blocks = 0;
  int32_t num_tails = 0;
  PoolShape pool_shape;
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

  // ---- KV eviction (cache/eviction_policy.h) ----
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
  absl::Status EnsureSampleCapacity(int64_t bytes);
  absl::Status EnsureCopyCapacity(int64_t pairs);
  absl::Status Upload(const BatchInput& batch, std::span<const int32_t> words,
                      const StagingLayout& layout);
  absl::Status RunForward(const StagingLayout& layout, const GpuAttentionLaunch& launch);
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
  // Copies primary blocks to or from tier payloads (ExportBlocks/ImportBlocks).
  absl::Status TierCopies(std::span<const BlockId> blocks, uint8_t* const* host, bool out,
                          const char* what);
  absl::Status SwapCopies(std::span<const BlockCopy> copies, uint8_t* src, const PoolShape& from,
                          uint8_t* dst, const PoolShape& to, cudaMemcpyKind kind, const char* what);
  absl::Status ForwardBatch(const BatchInput& batch);
  absl::Status PlanEviction(const BatchInput& batch);
  absl::Status RunMoves(std::span<const SlotMove> moves);
  absl::Status SampleRows(std::span<const SampleRow> rows, std::span<SampledToken> out);
};

CudaModelRunner::Impl::~Impl() {
  cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (auto& [bucket, g] : graphs) {
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  }
  if (batch_uploaded != nullptr) cudaEventDestroy(batch_uploaded);
  if (copies_uploaded != nullptr) cudaEventDestroy(copies_uploaded);
  if (ev_uploaded != nullptr) cudaEventDestroy(ev_uploaded);
  if (copy_stream != nullptr) cudaStreamSynchronize(copy_stream);
  if (compute_ready != nullptr) cudaEventDestroy(compute_ready);
  if (copies_done != nullptr) cudaEventDestroy(copies_done);
  gemm.reset();
  if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

// ---- Create ------------------------------------------------------------------

absl::Status CudaModelRunner::CheckDevice(const RunnerOptions& options, const DeviceSpec& device) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "model.device: ", options.device, ": no CUDA device is present",
        e != cudaSuccess ? absl::StrCat(" (", cudaGetErrorName(e), ": ", cudaGetErrorString(e), ")")
                         : std::string(),
        "; use model.device: cpu"));
  }
  if (device.ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("model.device: ", options.device, ": this machine has ", count, " CUDA device",
                     count == 1 ? "" : "s", " (0 .. ", count - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    LlamaWeights weights, const RunnerOptions& options, const DeviceSpec& device,
    WeightDtype dtype) {
  KV_RETURN_IF_ERROR(CheckDevice(options, device));
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.ordinal));
  cudaDeviceProp prop{};
  KV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device.ordinal));

  const ModelConfig& c = weights.config;
  KV_RETURN_IF_ERROR(c.Validate());
  if (c.head_dim % 2 != 0 || c.head_dim > kGpuAttentionMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.device: ", options.device, ": the CUDA kernels take an even head_dim up to ",
        kGpuAttentionMaxHeadDim, "; the model has ", c.head_dim));
  }
  if (c.vocab_size > kMaxSampleVocab) {
    return absl::InvalidArgumentError(absl::StrCat("model.device: ", options.device,
                                                   ": the device sampler takes a vocabulary of "
                                                   "at most ",
                                                   kMaxSampleVocab, "; the model has ",
                                                   c.vocab_size));
  }
  // One format per layer; int4_kc layers keep their partial blocks in fp16 tails.
  KV_ASSIGN_OR_RETURN(KvLayers layers,
                      ResolveKvLayers(options.kv_dtype,
                                      {c.num_layers, c.num_kv_heads, c.head_dim, options.block_size,
                                       options.int4_group_size, KvElem::kFp16}));
  const std::vector<KvFormat>& formats = layers.formats;

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.device = device.ordinal;
  m.config = c;
  m.format = formats[0];
  m.formats = formats;
  m.has_tails = layers.has_tails();
  m.weight_dtype = dtype;
  m.act = ToAct(dtype);
  m.elem = cuda::ActDtypeSize(m.act);
  m.options = options;
  m.max_model_len = options.max_model_len > 0 ? options.max_model_len : c.max_position_embeddings;
  if (m.max_model_len > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler.max_model_len: ", m.max_model_len,
                                                   " exceeds the model's max_position_embeddings ",
                                                   c.max_position_embeddings));
  }
  m.max_seqs = std::max(1, options.max_num_seqs);
  m.max_tokens = std::max(options.max_num_batched_tokens, m.max_seqs);
  m.max_logits_rows = m.max_seqs;
  m.max_blocks_per_seq = BlocksForTokens(m.max_model_len, options.block_size);
  m.num_sms = prop.multiProcessorCount;
  m.q_dim = int64_t{c.num_heads} * c.head_dim;
  m.kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  m.qkv_dim = m.q_dim + 2 * m.kv_dim;
  m.attn_shape = {c.num_heads, c.num_kv_heads, c.head_dim, c.sliding_window};
  m.eager_options.num_sms = m.num_sms;
  // Batch invariance: eager steps split a row's keys where graphs do
  // (graph_buckets.h), never by the batch's size.
  m.eager_options.fixed_partition_keys = kAttentionPartitionKeys;
  m.info.device = absl::StrCat("cuda:", device.ordinal, " (", prop.name, ")");
  m.info.weight_dtype = std::string(WeightDtypeName(dtype));
  m.info.num_swap_blocks = options.num_swap_blocks;

  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.batch_uploaded, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.copies_uploaded, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.ev_uploaded, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m.copy_stream, cudaStreamNonBlocking));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.compute_ready, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.copies_done, cudaEventDisableTiming));
  m.inv_freq = c.RopeInvFreq();

  KV_RETURN_IF_ERROR(m.UploadWeights(weights));
  weights = LlamaWeights();  // the host copy is no longer needed

  // Everything allocated from here to the end of the profile run counts as
  // activations (the GEMM workspace included).
  size_t free_before = 0, total = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_before, &total));
  KV_ASSIGN_OR_RETURN(m.gemm, cuda::Gemm::Create(m.act));
  KV_RETURN_IF_ERROR(m.AllocateActivations());
  KV_RETURN_IF_ERROR(m.ProfileRun());
  size_t free_after = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_after, &total));
  m.info.activation_bytes = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);

  KvPoolRequest pool;
  pool.num_blocks = options.num_blocks;
  pool.memory_bytes = options.memory_bytes;
  pool.memory_fraction = options.memory_fraction;
  pool.default_fraction = kDefaultCudaMemoryFraction;
  pool.available_bytes = static_cast<int64_t>(free_after);
  pool.reserve_bytes = kReserveBytes;
  pool.enforce_available = true;
  pool.weight_bytes = m.info.weight_bytes;
  pool.activation_bytes = m.info.activation_bytes;
  // Tails as on the CPU (model/runner_factory.cc): two per sequence slot,
  // as many in the swap pool; their bytes come off the budget first.
  m.num_tails = TailBlocksFor(layers, m.max_seqs);
  m.num_swap_tails = m.has_tails && options.num_swap_blocks > 0 ? m.num_tails : 0;
  pool.bytes_per_block = layers.bytes_per_block;
  pool.fixed_bytes = layers.bytes_per_tail * m.num_tails;
  pool.block_size = options.block_size;
  pool.max_model_len = m.max_model_len;
  pool.max_num_seqs = m.max_seqs;
  KV_ASSIGN_OR_RETURN(KvPoolPlan plan, PlanKvPool(pool));
  m.num_blocks = plan.num_blocks;
  m.num_swap_blocks = options.num_swap_blocks;
  m.info.kv_bytes_per_block = pool.bytes_per_block;
  m.info.num_blocks = plan.num_blocks;
  m.info.kv_pool_bytes = plan.pool_bytes + pool.fixed_bytes;  // int4_kc tails included
  m.info.kv_pool_tokens = plan.num_tokens;
  m.info.pool_sized_from = plan.sized_from;
  KV_RETURN_IF_ERROR(m.AllocatePools());
  if (options.cuda_graphs) KV_RETURN_IF_ERROR(m.CaptureGraphs());
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(impl)));
}

CudaModelRunner::CudaModelRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModelRunner::~CudaModelRunner() = default;

// ---- Weights -----------------------------------------------------------------

absl::Status CudaModelRunner::Impl::UploadWeights(const LlamaWeights& w) {
  wl = PlanDeviceWeights(config, elem);
  KV_ASSIGN_OR_RETURN(std::vector<WeightPiece> pieces, PlanWeightPieces(w, wl));
  KV_ASSIGN_OR_RETURN(weights, DeviceAlloc(wl.total_bytes, "the weights"));
  info.weight_bytes = wl.total_bytes;
  // Padding between matrices is zeroed so the arena's bytes are defined.
  KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(weights.get(), 0, wl.total_bytes, stream));

  int64_t host_floats = 0, generated_bytes = 0;
  for (const WeightPiece& p : pieces) {
    if (p.host != nullptr) {
      host_floats += p.numel;
    } else {
      generated_bytes += p.numel * elem;
    }
  }
  const bool generated = w.dummy_seed.has_value();
  const uint64_t key = generated ? DummyStreamKey(*w.dummy_seed) : 0;
  Progress progress(generated ? "generating weights" : "uploading weights",
                    host_floats * 4 + generated_bytes);

  HostBuffer pinned[2];
  DeviceBuffer scratch[2];
  cudaEvent_t done[2] = {nullptr, nullptr};
  const int64_t chunk = std::min<int64_t>(kUploadChunkFloats, std::max<int64_t>(host_floats, 1));
  if (host_floats > 0) {
    for (int i = 0; i < 2; ++i) {
      KV_ASSIGN_OR_RETURN(pinned[i], PinnedAlloc(chunk * 4, "the weight upload"));
      KV_ASSIGN_OR_RETURN(scratch[i], DeviceAlloc(chunk * 4, "the weight upload"));
      KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    }
  }
  auto destroy_events = [&done] {
    for (cudaEvent_t& e : done) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
  };
  absl::Status status;
  int slot = 0;
  for (const WeightPiece& p : pieces) {
    if (!status.ok()) break;
    uint8_t* dst = weights.get() + p.dst_offset;
    if (p.host == nullptr) {
      cuda::WeightFillParams f;
      f.dst = dst;
      f.n = p.numel;
      f.dtype = act;
      f.source = p.ones ? cuda::WeightSource::kOnes : cuda::WeightSource::kDummy;
      f.dummy_key = key;
      f.dummy_index = std::max<int64_t>(p.dummy_index, 0);
      status = cuda::FillWeights(f, stream);
      progress.Add(p.numel * elem);
      continue;
    }
    for (int64_t off = 0; off < p.numel && status.ok(); off += chunk) {
      const int64_t n = std::min(chunk, p.numel - off);
      // The pinned buffer of this slot is free once its last upload is done.
      status = CudaStatus(cudaEventSynchronize(done[slot]), "weight upload");
      if (!status.ok()) break;
      std::memcpy(pinned[slot].get(), p.host + off, n * 4);
      status = CudaStatus(cudaMemcpyAsync(scratch[slot].get(), pinned[slot].get(), n * 4,
                                          cudaMemcpyHostToDevice, stream),
                          "weight upload");
      if (!status.ok()) break;
      cuda::WeightFillParams f;
      f.dst = dst + off * elem;
      f.n = n;
      f.dtype = act;
      f.source = cuda::WeightSource::kFp32;
      f.src = reinterpret_cast<const float*>(scratch[slot].get());
      status = cuda::FillWeights(f, stream);
      if (status.ok()) status = CudaStatus(cudaEventRecord(done[slot], stream), "weight upload");
      slot ^= 1;
      progress.Add(n * 4);
    }
  }
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream), "weight upload");
  destroy_events();
  KV_RETURN_IF_ERROR(status);

  // The RoPE table of the CPU backend (scaled variants included), so both
  // rotate by the very same numbers.
  const cpu::RopeTable table(config.max_position_embeddings, config.RopeInvFreq());
  const int64_t table_bytes = int64_t{table.max_positions()} * table.half_dim() * 4;
  KV_ASSIGN_OR_RETURN(rope_cos, DeviceAlloc(table_bytes, "the RoPE table"));
  KV_ASSIGN_OR_RETURN(rope_sin, DeviceAlloc(table_bytes, "the RoPE table"));
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rope_cos.get(), table.cos(0), table_bytes, cudaMemcpyHostToDevice));
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rope_sin.get(), table.sin(0), table_bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// ---- Activations and workspaces ------------------------------------------------

absl::Status CudaModelRunner::Impl::AllocateActivations() {
  const ModelConfig& c = config;
  const int64_t T = max_tokens;
  KV_ASSIGN_OR_RETURN(x, DeviceAlloc(T * c.dim * elem, "activations (x)"));
  KV_ASSIGN_OR_RETURN(h, DeviceAlloc(T * c.dim * elem, "activations (h)"));
  KV_ASSIGN_OR_RETURN(qkv, DeviceAlloc(T * qkv_dim * elem, "activations (qkv)"));
  KV_ASSIGN_OR_RETURN(attn, DeviceAlloc(T * q_dim * elem, "activations (attention)"));
  KV_ASSIGN_OR_RETURN(gate_up,
                      DeviceAlloc(T * 2 * int64_t{c.hidden_dim} * elem, "activations (gate_up)"));
  KV_ASSIGN_OR_RETURN(final_rows,
                      DeviceAlloc(int64_t{max_logits_rows} * c.dim * elem, "activations (final)"));
  KV_ASSIGN_OR_RETURN(logits,
                      DeviceAlloc(int64_t{max_logits_rows} * c.vocab_size * 4, "the logits"));

  // Attention workspace and the staging capacity: the largest of the eager
  // plan's bounds and every graph bucket's.
  // Contexts are bounded by the block table's width (validated), which may
  // exceed max_model_len by less than a block.
  const int64_t max_context = int64_t{max_blocks_per_seq} * format.block_size();
  const GpuAttentionPlanBounds eager =
      GpuAttentionBounds(attn_shape, eager_options, max_tokens, max_context);
  attn_workspace_bytes = eager.workspace_bytes;
  int64_t max_words = eager.max_words;
  if (options.cuda_graphs) buckets = GraphBatchBuckets(max_seqs);
  for (int32_t bucket : buckets) {
    const GraphAttention g = GraphAttentionFor(attn_shape, eager_options, bucket, max_context);
    attn_workspace_bytes = std::max(attn_workspace_bytes, g.workspace_bytes);
    max_words = std::max(max_words, g.max_words);
  }
  KV_ASSIGN_OR_RETURN(attn_workspace, DeviceAlloc(attn_workspace_bytes, "the attention workspace"));
  StagingShape biggest;
  biggest.num_tokens = max_tokens;
  biggest.num_seqs = max_seqs;
  biggest.block_table_stride = max_blocks_per_seq;
  biggest.num_logits_rows = max_logits_rows;
  biggest.attention_words = static_cast<int32_t>(max_words);
  staging_capacity = PlanStaging(biggest).total_bytes;
  KV_ASSIGN_OR_RETURN(staging_host, PinnedAlloc(staging_capacity, "the batch staging"));
  KV_ASSIGN_OR_RETURN(staging_dev, DeviceAlloc(staging_capacity, "the batch staging"));

  // Sampling: rows go to the sampler in chunks of max_num_seqs.
  sample_chunk = max_seqs;
  sample_ws_layout = cuda::SampleWorkspaceFor(sample_chunk, c.vocab_size);
  KV_ASSIGN_OR_RETURN(sample_workspace,
                      DeviceAlloc(sample_ws_layout.bytes, "the sampler workspace"));
  // counts must be all zero before the first call (the sampler keeps it so).
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(sample_workspace.get(), 0, sample_ws_layout.bytes, stream));
  KV_ASSIGN_OR_RETURN(gathered, DeviceAlloc(int64_t{sample_chunk} * c.vocab_size * 4,
                                            "the sampler's gathered logits"));
  const int64_t results_bytes = int64_t{sample_chunk} * sizeof(SampleRowResult);
  KV_ASSIGN_OR_RETURN(results_dev, DeviceAlloc(results_bytes, "the sampler results"));
  KV_ASSIGN_OR_RETURN(results_host, PinnedAlloc(results_bytes, "the sampler results"));
  sampling = std::make_unique<SamplingBatch>(c.vocab_size);
  KV_RETURN_IF_ERROR(
      EnsureSampleCapacity(int64_t{sample_chunk} * (sizeof(SampleRowParams) + 4) + 64 * 1024));
  KV_RETURN_IF_ERROR(EnsureCopyCapacity(1024));
  return CudaStatus(cudaStreamSynchronize(stream), "allocating activations");
}

absl::Status CudaModelRunner::Impl::EnsureSampleCapacity(int64_t bytes) {
  if (bytes <= sample_capacity) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const int64_t want = std::max(bytes, 2 * sample_capacity);
  sample_host.reset();
  sample_dev.reset();
  sample_capacity = 0;
  KV_ASSIGN_OR_RETURN(sample_host, PinnedAlloc(want, "the sampling upload"));
  KV_ASSIGN_OR_RETURN(sample_dev, DeviceAlloc(want, "the sampling upload"));
  sample_capacity = want;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::EnsureCopyCapacity(int64_t pairs) {
  if (pairs <= copies_capacity) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const int64_t want = std::max(pairs, 2 * copies_capacity);
  copies_host.reset();
  copies_dev.reset();
  copies_capacity = 0;
  KV_ASSIGN_OR_RETURN(copies_host, PinnedAlloc(cuda::CopyListBytes(want), "the block copy list"));
  KV_ASSIGN_OR_RETURN(copies_dev, DeviceAlloc(cuda::CopyListBytes(want), "the block copy list"));
  copies_capacity = want;
  return absl::OkStatus();
}

// A step at the largest size the runner takes, on a temporary pool, so that
// cuBLASLt, the kernels' lazy module loading and the sampler have allocated
// whatever they allocate before the free memory is measured.
absl::Status CudaModelRunner::Impl::ProfileRun() {
  const int32_t bs = format.block_size();
  const int32_t seq_len = std::min(max_model_len, max_tokens);
  BatchInput batch;
  batch.Clear();
  int32_t blocks = 0;
  std::vector<int32_t> lens;
  for (int32_t left = max_tokens; left > 0 && static_cast<int32_t>(lens.size()) < max_seqs;) {
    const int32_t len = std::min(seq_len, left);
    lens.push_back(len);
    left -= len;
    blocks += BlocksForTokens(len, bs);
  }
  blocks = std::max(blocks, 2);
  batch.max_blocks_per_seq = BlocksForTokens(seq_len, bs);
  int32_t next_block = 0;
  for (int32_t len : lens) {
    std::vector<int32_t> row(batch.max_blocks_per_seq, 0);
    for (int32_t i = 0; i < BlocksForTokens(len, bs); ++i) row[i] = next_block++;
    for (int32_t i = 0; i < len; ++i) {
      batch.token_ids.push_back(i % config.vocab_size);
      batch.positions.push_back(i);
      batch.slot_mapping.push_back(int64_t{row[i / bs]} * bs + i % bs);
    }
    batch.query_start.push_back(batch.num_tokens());
    batch.context_len.push_back(len);
    batch.block_table.insert(batch.block_table.end(), row.begin(), row.end());
    batch.logits_rows.push_back(batch.num_tokens() - 1);
    if (has_tails) batch.tail_ids.push_back(static_cast<int32_t>(batch.tail_ids.size()));
  }

  const PoolShape shape = ShapeFor(blocks, has_tails ? static_cast<int32_t>(lens.size()) : 0);
  KV_ASSIGN_OR_RETURN(DeviceBuffer temp_pool,
                      DeviceAlloc(shape.bytes, "the profile run's KV pool"));
  KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(temp_pool.get(), 0, shape.bytes, stream));
  kv_pool.reset(temp_pool.release());
  num_blocks = blocks;
  num_tails = shape.tails;
  pool_shape = shape;
  absl::Status s = ForwardBatch(batch);
  if (s.ok()) {
    const BlockCopy copy[] = {{0, 1}};
    s = RunCopies(copy, kv_pool.get(), pool_shape, kv_pool.get(), pool_shape, "ProfileRun");
  }
  if (s.ok()) {
    // Every chunk row reads the one logits row: the gathered path.
    SamplingParams greedy;
    greedy.temperature = 0;
    std::vector<SampleRow> rows(sample_chunk);
    for (SampleRow& r : rows) r.params = &greedy;
    std::vector<SampledToken> out(rows.size());
    s = SampleRows(rows, out);
  }
  if (s.ok()) s = CudaStatus(cudaStreamSynchronize(stream), "the profile run");
  kv_pool.reset();
  num_blocks = 0;
  num_tails = 0;
  pool_shape = PoolShape();
  last_logits_rows = -1;
  counters = CudaModelRunner::Counters();  // the profile step is not a step of the engine's
  return s;
}

absl::Status CudaModelRunner::Impl::AllocatePools() {
  pool_shape = ShapeFor(num_blocks, num_tails);
  swap_shape = ShapeFor(num_swap_blocks, num_swap_tails);
  const int64_t bytes = pool_shape.bytes;
  KV_ASSIGN_OR_RETURN(kv_pool, DeviceAlloc(bytes, "the KV pool (cache.*)"));
  KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_pool.get(), 0, bytes, stream));
  if (num_swap_blocks > 0) {
    const int64_t swap_bytes = swap_shape.bytes;
    KV_ASSIGN_OR_RETURN(swap_host, PinnedAlloc(swap_bytes, "the swap pool (cache.num_swap_blocks)",
                                               cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(swap_host.get(), 0, swap_bytes);
    KV_ASSIGN_OR_RETURN(swap_dev, cuda::MappedDevicePointer(swap_host.get()));
  }
  return CudaStatus(cudaStreamSynchronize(stream), "allocating the KV pools");
}

absl::Status CudaModelRunner::Impl::CaptureGraphs() {
  for (int32_t bucket : buckets) {
    const GraphAttention ga = GraphAttentionFor(attn_shape, eager_options, bucket,
                                                int64_t{max_blocks_per_seq} * format.block_size());
    GraphStep g;
    g.bucket = bucket;
    g.options = ga.options;
    g.launch = ga.launch;
    g.layout = PlanStaging(
        PaddedDecodeShape(bucket, max_blocks_per_seq, static_cast<int32_t>(ga.max_words)));
    auto fail = [&](const absl::Status& s) {
      return absl::Status(s.code(),
                          absl::StrCat("model.cuda_graphs: capturing the decode step of ", bucket,
                                       " sequences failed: ", std::string(s.message()),
                                       " (model.cuda_graphs: false runs it eagerly)"));
    };
    // A warm-up at the bucket's shape (all rows padding: no K/V written, no
    // attention work), so the capture itself makes no first-use calls.
    BatchInput empty;
    empty.Clear();
    absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(empty), attn_shape, g.options);
    if (!plan.ok()) return fail(plan.status());
    if (absl::Status s = Upload(empty, plan->words(), g.layout); !s.ok()) return fail(s);
    if (absl::Status s = RunForward(g.layout, g.launch); !s.ok()) return fail(s);
    if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream), "warm-up"); !s.ok()) {
      return fail(s);
    }
    cudaGraph_t graph = nullptr;
    absl::Status s = CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                                "cudaStreamBeginCapture");
    if (!s.ok()) return fail(s);
    const absl::Status run = RunForward(g.layout, g.launch);
    s = CudaStatus(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    if (!run.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return fail(run);
    }
    if (!s.ok()) return fail(s);
    s = CudaStatus(cudaGraphInstantiate(&g.exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    if (!s.ok()) return fail(s);
    graphs.emplace(bucket, g);
  }
  return absl::OkStatus();
}

// ---- One step ----------------------------------------------------------------

absl::Status CudaModelRunner::Impl::Upload(const BatchInput& batch, std::span<const int32_t> words,
                                           const StagingLayout& layout) {
  if (layout.total_bytes > staging_capacity) {
    return absl::InternalError(absl::StrCat("batch staging: a layout of ", layout.total_bytes,
                                            " bytes exceeds the ", staging_capacity, " allocated"));
  }
  // The previous upload must have left the pinned buffer before it is reused.
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(batch_uploaded));
  KV_RETURN_IF_ERROR(FillBatchStaging(batch, words, layout,
                                      std::span<uint8_t>(staging_host.get(), staging_capacity)));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_dev.get(), staging_host.get(), layout.total_bytes,
                                          cudaMemcpyHostToDevice, stream));
  return CudaStatus(cudaEventRecord(batch_uploaded, stream), "batch upload");
}

absl::Status CudaModelRunner::Impl::RunForward(const StagingLayout& l,
                                               const GpuAttentionLaunch& launch) {
  const ModelConfig& c = config;
  const StagingShape& s = l.shape;
  const int32_t T = s.num_tokens, R = s.num_logits_rows;
  if (T == 0) return absl::OkStatus();
  uint8_t* base = staging_dev.get();
  BatchView view;
  view.token_ids = reinterpret_cast<const int32_t*>(base + l.token_ids.offset);
  view.positions = reinterpret_cast<const int32_t*>(base + l.positions.offset);
  view.slot_mapping = reinterpret_cast<const int64_t*>(base + l.slot_mapping.offset);
  view.query_start = reinterpret_cast<const int32_t*>(base + l.query_start.offset);
  view.context_len = reinterpret_cast<const int32_t*>(base + l.context_len.offset);
  view.block_table = reinterpret_cast<const int32_t*>(base + l.block_table.offset);
  view.logits_rows = reinterpret_cast<const int32_t*>(base + l.logits_rows.offset);
  view.tail_ids = reinterpret_cast<const int32_t*>(base + l.tail_ids.offset);
  view.num_tokens = T;
  view.num_seqs = s.num_seqs;
  view.max_blocks_per_seq = std::max(1, s.block_table_stride);
  view.num_logits_rows = R;
  const int32_t* plan_words = reinterpret_cast<const int32_t*>(base + l.attention.offset);
  const int64_t dim = c.dim, hid = c.hidden_dim;
  // Embedding lookups and RMSNorms of this step differ only in these
  // arguments; the rest is the step's (act, eps, stream).
  auto embedding = [&](const void* table, const int32_t* ids, void* out, int64_t vocab,
                       int64_t rows) {
    return cuda::Embedding({.table = table,
                            .ids = ids,
                            .out = out,
                            .vocab = vocab,
                            .dim = dim,
                            .num_tokens = rows,
                            .dtype = act},
                           stream);
  };
  // `rows` rows of `width` values, `stride` apart (0: width).
  auto rms_norm = [&](void* x, const void* weight, void* out, int64_t rows, int64_t width,
                      int64_t stride = 0) {
    return cuda::RmsNorm({.x = x,
                          .weight = weight,
                          .out = out,
                          .num_tokens = rows,
                          .dim = width,
                          .x_stride = stride,
                          .out_stride = stride,
                          .eps = c.rms_norm_eps,
                          .dtype = act},
                         stream);
  };

  KV_RETURN_IF_ERROR(embedding(Weight(wl.embeddings), view.token_ids, x.get(), c.vocab_size, T));

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const DeviceLayerWeights& w = wl.layers[layer];
    PagedKvView kv;
    kv.pages = kv_pool.get() + pool_shape.layer_offset[layer];
    kv.num_blocks = num_blocks;
    kv.layout = formats[layer].layout();
    const bool kc = kv.layout.has_tails();  // int4_kc: seal, attention, tails
    if (kc) {
      kv.tails = kv_pool.get() + pool_shape.tail_offset[layer];
      kv.num_tails = num_tails;
    }
    cuda::KvKcWriteParams kcw;
    kcw.k = Act(qkv, q_dim);
    kcw.v = Act(qkv, q_dim + kv_dim);
    kcw.k_stride = qkv_dim;
    kcw.v_stride = qkv_dim;
    kcw.dtype = act;
    kcw.batch = view;
    kcw.kv = kv;

    KV_RETURN_IF_ERROR(rms_norm(x.get(), Weight(w.attn_norm), h.get(), T, dim));
    KV_RETURN_IF_ERROR(gemm->Linear({.x = h.get(),
                                     .w = Weight(w.wqkv),
                                     .y = qkv.get(),
                                     .rows = T,
                                     .in = dim,
                                     .out = qkv_dim,
                                     .bias = c.qkv_bias ? Weight(w.bqkv) : nullptr,
                                     .y_dtype = act},
                                    stream));

    if (c.qk_norm) {
      // Every q and k head of every row is one RMSNorm row of head_dim
      // values: one launch (per-head form), q_norm for the q heads.
      KV_RETURN_IF_ERROR(cuda::RmsNorm({.x = qkv.get(),
                                        .weight = Weight(w.q_norm),
                                        .out = qkv.get(),
                                        .num_tokens = T,
                                        .dim = c.head_dim,
                                        .x_stride = qkv_dim,
                                        .out_stride = qkv_dim,
                                        .eps = c.rms_norm_eps,
                                        .dtype = act,
                                        .heads = c.num_heads + c.num_kv_heads,
                                        .weight2 = Weight(w.k_norm),
                                        .weight2_from = c.num_heads},
                                       stream));
    }
    const uint8_t* ev_base = ev.active ? ev_dev.get() : nullptr;
    if (ev.active && ev.sinks) {
      // The sink query: the same q rotated at the row's cache index (its
      // in-cache position), kept at q's stride.
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(sink_q.get(), qkv_dim * elem, qkv.get(),
                                                qkv_dim * elem, q_dim * elem, T,
                                                cudaMemcpyDeviceToDevice, stream));
      cuda::RopeParams sr;
      sr.q = sink_q.get();
      sr.q_stride = qkv_dim;
      sr.positions = reinterpret_cast<const int32_t*>(ev_base + ev.sink_pos_off);
      sr.cos = reinterpret_cast<const float*>(rope_cos.get());
      sr.sin = reinterpret_cast<const float*>(rope_sin.get());
      sr.max_positions = c.max_position_embeddings;
      if (ev.sink_rope_rows) {
        sr.row_cos = reinterpret_cast<const float*>(ev_base + ev.sink_rope_off);
        sr.row_sin = sr.row_cos + int64_t{T} * (c.head_dim / 2);
      }
      sr.num_tokens = T;
      sr.num_q_heads = c.num_heads;
      sr.num_kv_heads = c.num_kv_heads;
      sr.head_dim = c.head_dim;
      sr.style = c.rope_style == RopeStyle::kInterleaved ? cuda::RopeStyle::kInterleaved
                                                         : cuda::RopeStyle::kNeox;
      sr.dtype = act;
      KV_RETURN_IF_ERROR(cuda::ApplyRope(sr, stream));
    }
    cuda::RopeParams rope;
    rope.q = qkv.get();
    rope.k = Act(qkv, q_dim);
    rope.q_stride = qkv_dim;
    rope.k_stride = qkv_dim;
    rope.positions = view.positions;
    rope.cos = reinterpret_cast<const float*>(rope_cos.get());
    rope.sin = reinterpret_cast<const float*>(rope_sin.get());
    rope.max_positions = c.max_position_embeddings;
    if (ev.active && ev.rope_rows) {
      rope.row_cos = reinterpret_cast<const float*>(ev_base + ev.rope_off);
      rope.row_sin = rope.row_cos + int64_t{T} * (c.head_dim / 2);
    }
    rope.num_tokens = T;
    rope.num_q_heads = c.num_heads;
    rope.num_kv_heads = c.num_kv_heads;
    rope.head_dim = c.head_dim;
    rope.style = c.rope_style == RopeStyle::kInterleaved ? cuda::RopeStyle::kInterleaved
                                                         : cuda::RopeStyle::kNeox;
    rope.dtype = act;
    KV_RETURN_IF_ERROR(cuda::ApplyRope(rope, stream));

    cuda::KvWriteParams kw;
    kw.k = Act(qkv, q_dim);
    kw.v = Act(qkv, q_dim + kv_dim);
    kw.k_stride = qkv_dim;
    kw.v_stride = qkv_dim;
    kw.slot_mapping = view.slot_mapping;
    kw.num_tokens = T;
    kw.kv = kv;
    kw.dtype = act;
    KV_RETURN_IF_ERROR(kc ? cuda::SealKvBlocks(kcw, stream) : cuda::WriteKv(kw, stream));

    cuda::PagedAttentionParams pa;
    pa.q = qkv.get();
    pa.out = attn.get();
    pa.q_stride = qkv_dim;
    pa.out_stride = q_dim;
    pa.dtype = act;
    pa.kv = kv;
    pa.batch = view;
    pa.num_heads = c.num_heads;
    pa.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    pa.sliding_window = c.sliding_window;
    pa.plan = plan_words;
    pa.launch = launch;
    pa.workspace = attn_workspace.get();
    pa.workspace_bytes = attn_workspace_bytes;
    pa.kernel = options.attention_kernel == "reference" ? cuda::AttentionKernel::kReference
                                                        : cuda::AttentionKernel::kFast;
    pa.num_sms = num_sms;  // a persistent grid: decode graphs sized for capacities stay small
    if (kc) {
      const cuda::PagedAttentionKcParams pk{.attn = pa,
                                            .new_k = kcw.k,
                                            .new_v = kcw.v,
                                            .new_k_stride = qkv_dim,
                                            .new_v_stride = qkv_dim};
      KV_RETURN_IF_ERROR(cuda::PagedAttentionKc(pk, stream));
      KV_RETURN_IF_ERROR(cuda::WriteKvTails(kcw, stream));
    } else {
      // Eviction (sinks, attention mass) only reaches per-token formats:
      // supports_eviction() is false when any layer is int4_kc.
      if (ev.active && ev.sinks) {
        pa.sink_q = sink_q.get();
        pa.num_sinks = reinterpret_cast<const int32_t*>(ev_base + ev.num_sinks_off);
      }
      if (ev.active && ev.mass) {
        pa.key_mass = reinterpret_cast<float*>(key_mass.get());
        pa.key_mass_offset = reinterpret_cast<const int64_t*>(ev_base + ev.mass_offset_off);
        pa.softmax_stats = reinterpret_cast<float*>(softmax_stats.get());
      }
      KV_RETURN_IF_ERROR(cuda::PagedAttention(pa, stream));
      if (ev.active && ev.mass) {
        cuda::GatherMassParams g;
        g.batch = view;
        g.sliding_window = c.sliding_window;
        g.key_mass = pa.key_mass;
        g.key_mass_offset = pa.key_mass_offset;
        g.stats_offset = reinterpret_cast<const int64_t*>(ev_base + ev.stats_offset_off) +
                         int64_t{layer} * s.num_seqs;
        g.out = reinterpret_cast<float*>(attn_stats.get());
        KV_RETURN_IF_ERROR(cuda::GatherAttentionMass(g, stream));
      }
    }

    KV_RETURN_IF_ERROR(gemm->Linear({.x = attn.get(),
                                     .w = Weight(w.wo),
                                     .y = x.get(),
                                     .rows = T,
                                     .in = q_dim,
                                     .out = dim,
                                     .accumulate = true,
                                     .bias = c.o_bias ? Weight(w.bo) : nullptr,
                                     .y_dtype = act},
                                    stream));
    KV_RETURN_IF_ERROR(rms_norm(x.get(), Weight(w.ffn_norm), h.get(), T, dim));
    KV_RETURN_IF_ERROR(gemm->Linear({.x = h.get(),
                                     .w = Weight(w.w_gate_up),
                                     .y = gate_up.get(),
                                     .rows = T,
                                     .in = dim,
                                     .out = 2 * hid,
                                     .y_dtype = act},
                                    stream));

    cuda::SwiGluParams sw;
    sw.gate_up = gate_up.get();
    sw.out = gate_up.get();  // in place: row t's first `hidden` values
    sw.num_tokens = T;
    sw.hidden = hid;
    sw.gate_up_stride = 2 * hid;
    sw.out_stride = 2 * hid;
    sw.dtype = act;
    KV_RETURN_IF_ERROR(cuda::SwiGlu(sw, stream));

    KV_RETURN_IF_ERROR(gemm->Linear({.x = gate_up.get(),
                                     .w = Weight(w.w_down),
                                     .y = x.get(),
                                     .rows = T,
                                     .in = hid,
                                     .out = dim,
                                     .ldx = 2 * hid,
                                     .accumulate = true,
                                     .y_dtype = act},
                                    stream));
  }

  if (R == 0) return absl::OkStatus();
  // The logits rows of the residual stream, gathered (an embedding lookup
  // whose table is x), normed and multiplied by the head.
  KV_RETURN_IF_ERROR(embedding(x.get(), view.logits_rows, final_rows.get(), T, R));
  KV_RETURN_IF_ERROR(rms_norm(final_rows.get(), Weight(wl.final_norm), final_rows.get(), R, dim));
  return gemm->Linear({.x = final_rows.get(),
                       .w = Weight(wl.lm_head),
                       .y = logits.get(),
                       .rows = R,
                       .in = dim,
                       .out = c.vocab_size,
                       .y_dtype = ActDtype::kFp32},
                      stream);
}

absl::Status CudaModelRunner::Impl::ForwardBatch(const BatchInput& batch) {
  last_logits_rows = -1;
  ev = Eviction();
  BatchLimits limits;
  limits.vocab_size = config.vocab_size;
  // Positions past the RoPE table (sequences that evict) get host-computed
  // cos/sin rows (PlanEviction).
  limits.max_positions = std::numeric_limits<int32_t>::max();
  limits.num_blocks = num_blocks;
  limits.block_size = format.block_size();
  limits.num_tails = num_tails;
  limits.sliding_window = config.sliding_window;
  KV_RETURN_IF_ERROR(ValidateBatch(batch, limits));
  const int32_t T = batch.num_tokens(), B = batch.num_seqs();
  const int32_t R = static_cast<int32_t>(batch.logits_rows.size());
  auto too_big = [](const char* what, int64_t have, int64_t most, const char* key) {
    return absl::InvalidArgumentError(absl::StrCat("BatchInput: ", what, " is ", have,
                                                   "; the CUDA runner was sized for ", most, " (",
                                                   key, ")"));
  };
  if (T > max_tokens) {
    return too_big("num_tokens", T, max_tokens, "scheduler.max_num_batched_tokens");
  }
  if (B > max_seqs) return too_big("num_seqs", B, max_seqs, "scheduler.max_num_seqs");
  if (R > max_logits_rows) {
    return too_big("the logits row count", R, max_logits_rows, "scheduler.max_num_seqs");
  }
  if (batch.max_blocks_per_seq > max_blocks_per_seq) {
    return too_big("max_blocks_per_seq", batch.max_blocks_per_seq, max_blocks_per_seq,
                   "scheduler.max_model_len");
  }
  if (T == 0) {
    last_logits_rows = 0;
    return absl::OkStatus();
  }
  KV_RETURN_IF_ERROR(PlanEviction(batch));
  const GraphStep* graph = nullptr;
  if (!graphs.empty() && !ev.active && IsPureDecode(batch)) {
    if (auto it = graphs.find(GraphBucketFor(buckets, B)); it != graphs.end()) {
      graph = &it->second;
    }
  }
  KV_ASSIGN_OR_RETURN(
      GpuAttentionPlan plan,
      PlanGpuAttention(ViewOf(batch), attn_shape, graph ? graph->options : eager_options));
  if (graph != nullptr) {
    KV_RETURN_IF_ERROR(Upload(batch, plan.words(), graph->layout));
    KV_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->exec, stream));
    ++counters.graph_steps;
  } else {
    const StagingLayout layout =
        PlanStaging(ShapeOfBatch(batch, static_cast<int32_t>(plan.words().size())));
    KV_RETURN_IF_ERROR(Upload(batch, plan.words(), layout));
    KV_RETURN_IF_ERROR(RunForward(layout, plan.launch()));
    ++counters.eager_steps;
  }
  last_logits_rows = R;
  return absl::OkStatus();
}

// ---- KV eviction ---------------------------------------------------------------

namespace {

// Grows `buf` to at least `bytes` (and `capacity` with it); the stream must
// be idle so that no queued work reads the old buffer.
absl::Status Grow(DeviceBuffer& buf, int64_t& capacity, int64_t bytes, cudaStream_t stream,
                  const char* what) {
  if (bytes <= capacity) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  buf.reset();
  capacity = 0;
  KV_ASSIGN_OR_RETURN(buf, DeviceAlloc(bytes, what));
  capacity = bytes;
  return absl::OkStatus();
}

int64_t Align16(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

absl::Status CudaModelRunner::Impl::PlanEviction(const BatchInput& batch) {
  const int32_t T = batch.num_tokens(), B = batch.num_seqs(), L = config.num_layers;
  const int32_t max_pos = config.max_position_embeddings;
  const int half = config.head_dim / 2;
  Eviction e;
  e.sinks =
      std::any_of(batch.num_sinks.begin(), batch.num_sinks.end(), [](int32_t n) { return n > 0; });
  e.mass = std::any_of(batch.attention_stats.begin(), batch.attention_stats.end(),
                       [](uint8_t x) { return x != 0; });
  e.rope_rows = std::any_of(batch.positions.begin(), batch.positions.end(),
                            [&](int32_t p) { return p >= max_pos; });
  e.active = e.sinks || e.mass || e.rope_rows;
  if (!e.active) {
    ev = e;
    return absl::OkStatus();
  }
  const BatchView view = ViewOf(batch);
  std::vector<int32_t> sink_pos;
  if (e.sinks) {
    sink_pos.resize(T);
    for (int32_t b = 0; b < B; ++b) {
      for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
        sink_pos[r] = view.CacheIndex(b, r);
      }
    }
    e.sink_rope_rows =
        std::any_of(sink_pos.begin(), sink_pos.end(), [&](int32_t p) { return p >= max_pos; });
  }
  // Layout of the upload, 16-byte aligned sections.
  int64_t off = 0;
  auto section = [&](int64_t bytes) {
    const int64_t at = off;
    off += Align16(bytes);
    return at;
  };
  if (e.sinks) {
    e.num_sinks_off = section(int64_t{B} * 4);
    e.sink_pos_off = section(int64_t{T} * 4);
  }
  if (e.mass) {
    e.mass_offset_off = section(int64_t{T} * 8);
    e.stats_offset_off = section(int64_t{L} * B * 8);
  }
  if (e.rope_rows) e.rope_off = section(int64_t{T} * half * 8);
  if (e.sink_rope_rows) e.sink_rope_off = section(int64_t{T} * half * 8);
  ev_scratch.assign(off, 0);
  uint8_t* base = ev_scratch.data();
  if (e.sinks) {
    int32_t* ns = reinterpret_cast<int32_t*>(base + e.num_sinks_off);
    for (int32_t b = 0; b < B; ++b) ns[b] = std::max(0, batch.num_sinks[b]);
    std::memcpy(base + e.sink_pos_off, sink_pos.data(), int64_t{T} * 4);
  }
  if (e.mass) {
    // As the CPU runner (model/cpu/cpu_forward.cc PlanEviction): each recorded
    // row's keys in row order; each recorded sequence's [L][context_len].
    int64_t* mo = reinterpret_cast<int64_t*>(base + e.mass_offset_off);
    int64_t* so = reinterpret_cast<int64_t*>(base + e.stats_offset_off);
    std::fill(mo, mo + T, int64_t{-1});
    std::fill(so, so + int64_t{L} * B, int64_t{-1});
    for (int32_t b = 0; b < static_cast<int32_t>(batch.attention_stats.size()); ++b) {
      if (batch.attention_stats[b] == 0) continue;
      for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
        mo[r] = e.num_keys;
        e.num_keys += NumKeys(view.CacheIndex(b, r), config.sliding_window);
      }
      for (int32_t l = 0; l < L; ++l) {
        so[int64_t{l} * B + b] = e.num_stats + int64_t{l} * batch.context_len[b];
      }
      e.num_stats += int64_t{L} * batch.context_len[b];
    }
  }
  // cos/sin rows for positions past the table, as the CPU's RopeAt: the
  // angle in float, then cosf / sinf.
  auto rope_rows = [&](int64_t at, auto pos_of) {
    float* cs = reinterpret_cast<float*>(base + at);
    float* sn = cs + int64_t{T} * half;
    for (int32_t t = 0; t < T; ++t) {
      const int32_t pos = pos_of(t);
      if (pos < max_pos) continue;
      for (int j = 0; j < half; ++j) {
        const float val = static_cast<float>(pos) * inv_freq[j];
        cs[int64_t{t} * half + j] = cosf(val);
        sn[int64_t{t} * half + j] = sinf(val);
      }
    }
  };
  if (e.rope_rows) rope_rows(e.rope_off, [&](int32_t t) { return batch.positions[t]; });
  if (e.sink_rope_rows) rope_rows(e.sink_rope_off, [&](int32_t t) { return sink_pos[t]; });

  // Device buffers (first eviction step, then growth).
  if (e.sinks && sink_q == nullptr) {
    KV_ASSIGN_OR_RETURN(sink_q,
                        DeviceAlloc(int64_t{max_tokens} * qkv_dim * elem, "the sink queries"));
  }
  if (e.mass) {
    if (softmax_stats == nullptr) {
      KV_ASSIGN_OR_RETURN(softmax_stats, DeviceAlloc(int64_t{max_tokens} * config.num_heads * 2 * 4,
                                                     "the attention softmax statistics"));
    }
    KV_RETURN_IF_ERROR(Grow(key_mass, key_mass_capacity, std::max<int64_t>(e.num_keys, 1) * 4,
                            stream, "the attention key mass"));
    KV_RETURN_IF_ERROR(Grow(attn_stats, attn_stats_capacity, std::max<int64_t>(e.num_stats, 1) * 4,
                            stream, "the attention statistics"));
  }
  if (off > ev_capacity) {
    KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    ev_host.reset();
    ev_dev.reset();
    ev_capacity = 0;
    const int64_t cap = std::max<int64_t>(off * 2, 4096);
    KV_ASSIGN_OR_RETURN(ev_host, PinnedAlloc(cap, "the eviction staging"));
    KV_ASSIGN_OR_RETURN(ev_dev, DeviceAlloc(cap, "the eviction staging"));
    ev_capacity = cap;
  }
  // The previous eviction upload must have left the pinned buffer.
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev_uploaded));
  std::memcpy(ev_host.get(), base, off);
  if (off > 0) {
    KV_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ev_dev.get(), ev_host.get(), off, cudaMemcpyHostToDevice, stream));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_uploaded, stream));
  ev = e;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::RunMoves(std::span<const SlotMove> moves) {
  if (moves.empty()) return absl::OkStatus();
  const int64_t num_slots = int64_t{num_blocks} * format.block_size();
  for (const SlotMove& mv : moves) {
    if (mv.src < 0 || mv.src >= num_slots || mv.dst < 0 || mv.dst >= num_slots) {
      std::fprintf(
          stderr,
          "CudaModelRunner::MoveSlots: slot move %lld -> %lld outside the pool (%lld slots)\n",
          static_cast<long long>(mv.src), static_cast<long long>(mv.dst),
          static_cast<long long>(num_slots));
      std::abort();
    }
  }
  // The copy list buffers carry the moves: one move is two int32 pairs' bytes.
  const int64_t n = static_cast<int64_t>(moves.size());
  static_assert(sizeof(SlotMove) == 16);
  KV_RETURN_IF_ERROR(EnsureCopyCapacity(2 * n));
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copies_uploaded));
  std::memcpy(copies_host.get(), moves.data(), cuda::MoveListBytes(n));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies_dev.get(), copies_host.get(),
                                          cuda::MoveListBytes(n), cudaMemcpyHostToDevice, stream));
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_uploaded, stream));
  cuda::MoveSlotsParams p;
  p.pool = kv_pool.get();
  p.num_layers = config.num_layers;
  p.num_blocks = num_blocks;
  p.layout = format.layout();
  p.moves = reinterpret_cast<const int64_t*>(copies_dev.get());
  p.num_moves = static_cast<int32_t>(n);
  return cuda::MoveSlots(p, stream);
}

// ---- Sampling ----------------------------------------------------------------

absl::Status CudaModelRunner::Impl::SampleRows(std::span<const SampleRow> rows,
                                               std::span<SampledToken> out) {
  KV_RETURN_IF_ERROR(ValidateSampleRows(rows, out.size(), std::max(0, last_logits_rows),
                                        /*masks_supported=*/true));
  const int32_t vocab = config.vocab_size;
  const int64_t mask_words = cuda::TokenMaskWords(vocab);
  for (size_t begin = 0; begin < rows.size(); begin += sample_chunk) {
    const size_t n = std::min(rows.size() - begin, static_cast<size_t>(sample_chunk));
    sampling->Clear();
    bool identity = true;
    gather_index.clear();
    for (size_t i = 0; i < n; ++i) {
      const SampleRow& r = rows[begin + i];
      const SamplingParams& sp = *r.params;
      SampleRowParams p;
      p.temperature = sp.temperature;
      p.top_k = sp.top_k;
      p.top_p = sp.top_p;
      p.min_p = sp.min_p;
      p.repetition_penalty = sp.repetition_penalty;
      p.frequency_penalty = sp.frequency_penalty;
      p.presence_penalty = sp.presence_penalty;
      p.num_top_logprobs = r.num_logprobs;
      p.seed = r.seed;
      p.step = r.output.size();
      if (absl::Status s =
              sampling->AddRow(p, absl::Span<const int32_t>(r.prompt.data(), r.prompt.size()),
                               absl::Span<const int32_t>(r.output.data(), r.output.size()));
          !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Sample: rows[", begin + i, "]: ", std::string(s.message())));
      }
      gather_index.push_back(r.logits_index);
      identity = identity && r.logits_index == static_cast<int32_t>(begin + i);
    }
    // Masked rows (constrained decoding) are masked in a private copy: the
    // gather path, with the masks uploaded after the gather index (all ones
    // for a row without one).
    bool masked = false;
    for (size_t i = 0; i < n; ++i) masked = masked || !rows[begin + i].allowed.empty();
    identity = identity && !masked;
    const int64_t packed = sampling->PackedBytes();
    const int64_t index_offset = (packed + 15) / 16 * 16;
    const int64_t mask_offset = (index_offset + static_cast<int64_t>(n) * 4 + 15) / 16 * 16;
    const int64_t upload = masked ? mask_offset + static_cast<int64_t>(n) * mask_words * 4
                                  : index_offset + static_cast<int64_t>(n) * 4;
    KV_RETURN_IF_ERROR(EnsureSampleCapacity(upload));
    sampling->PackInto(sample_host.get());
    std::memcpy(sample_host.get() + index_offset, gather_index.data(), n * 4);
    if (masked) {
      auto* words = reinterpret_cast<uint32_t*>(sample_host.get() + mask_offset);
      for (size_t i = 0; i < n; ++i) {
        const std::span<const uint32_t> allowed = rows[begin + i].allowed;
        uint32_t* dst = words + static_cast<int64_t>(i) * mask_words;
        if (allowed.empty()) {
          std::fill(dst, dst + mask_words, ~uint32_t{0});
        } else {
          std::memcpy(dst, allowed.data(), static_cast<size_t>(mask_words) * 4);
        }
      }
    }
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_dev.get(), sample_host.get(), upload,
                                            cudaMemcpyHostToDevice, stream));
    const float* row_logits =
        reinterpret_cast<const float*>(logits.get()) + static_cast<int64_t>(begin) * vocab;
    if (!identity) {
      // Samples that share a logits row (a fresh fork) each get a copy.
      cuda::EmbeddingParams gather;
      gather.table = logits.get();
      gather.ids = reinterpret_cast<const int32_t*>(sample_dev.get() + index_offset);
      gather.out = gathered.get();
      gather.vocab = std::max(1, last_logits_rows);
      gather.dim = vocab;
      gather.num_tokens = static_cast<int64_t>(n);
      gather.dtype = ActDtype::kFp32;
      KV_RETURN_IF_ERROR(cuda::Embedding(gather, stream));
      row_logits = reinterpret_cast<const float*>(gathered.get());
      if (masked) {
        cuda::TokenMaskParams tm;
        tm.logits = reinterpret_cast<float*>(gathered.get());
        tm.masks = reinterpret_cast<const uint32_t*>(sample_dev.get() + mask_offset);
        tm.vocab = vocab;
        tm.num_rows = static_cast<int32_t>(n);
        KV_RETURN_IF_ERROR(cuda::ApplyTokenMasks(tm, stream));
      }
    }
    cuda::SampleParams sp;
    sp.logits = row_logits;
    sp.dtype = ActDtype::kFp32;
    sp.vocab = vocab;
    sp.num_rows = static_cast<int32_t>(n);
    sp.rows = reinterpret_cast<const SampleRowParams*>(sample_dev.get());
    sp.history =
        sampling->history().empty()
            ? nullptr
            : reinterpret_cast<const int32_t*>(sample_dev.get() + sampling->HistoryByteOffset());
    sp.processed =
        reinterpret_cast<float*>(sample_workspace.get() + sample_ws_layout.processed_offset);
    sp.counts = reinterpret_cast<int32_t*>(sample_workspace.get() + sample_ws_layout.counts_offset);
    sp.results = reinterpret_cast<SampleRowResult*>(results_dev.get());
    KV_RETURN_IF_ERROR(cuda::SampleTokens(sp, stream));
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(results_host.get(), results_dev.get(),
                                            n * sizeof(SampleRowResult), cudaMemcpyDeviceToHost,
                                            stream));
    KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const SampleRowResult* results = reinterpret_cast<const SampleRowResult*>(results_host.get());
    for (size_t i = 0; i < n; ++i) {
      const SampleRow& r = rows[begin + i];
      const SampleRowResult& res = results[i];
      SampledToken& o = out[begin + i];
      o.token = res.token;
      o.logprob = r.num_logprobs >= 0 ? res.logprob : 0.0f;
      o.top.clear();
      for (int32_t k = 0; k < r.num_logprobs; ++k) {
        if (res.top_ids[k] < 0) break;
        o.top.emplace_back(res.top_ids[k], res.top_logprobs[k]);
      }
      if (o.token < 0 || o.token >= vocab) {
        return absl::InternalError(absl::StrCat("Sample: the device sampler returned token ",
                                                o.token, " for rows[", begin + i, "]"));
      }
    }
  }
  return absl::OkStatus();
}

// ---- Copies ------------------------------------------------------------------

// A copy's pool-local ids: ids past a pool's blocks name its tails
// (cache/block_copy.h), local to the tail pool. An id outside the pools is
// a scheduler bug: abort with both pools' sizes.
struct LocalCopy {
  bool tail;
  int32_t src, dst;
};
static LocalCopy Localize(const BlockCopy& cp, const PoolShape& from, const PoolShape& to,
                          const char* what) {
  const bool tail = cp.src >= from.blocks;
  const int32_t s = tail ? cp.src - from.blocks : cp.src;
  const int32_t d = tail ? cp.dst - to.blocks : cp.dst;
  if (cp.src < 0 || cp.dst < 0 || s >= (tail ? from.tails : from.blocks) || d < 0 ||
      d >= (tail ? to.tails : to.blocks)) {
    std::fprintf(stderr,
                 "CudaModelRunner::%s: %s copy %d -> %d outside the pools (%d + %d tails, %d + %d "
                 "tails)\n",
                 what, tail ? "tail" : "block", cp.src, cp.dst, from.blocks, from.tails, to.blocks,
                 to.tails);
    std::abort();
  }
  return {tail, s, d};
}

absl::Status CudaModelRunner::Impl::RunCopies(std::span<const BlockCopy> copies, const uint8_t* src,
                                              const PoolShape& from, uint8_t* dst,
                                              const PoolShape& to, const char* what) {
  if (copies.empty()) return absl::OkStatus();
  // Ids past a pool's blocks name its tails (cache/block_copy.h); a copy is
  // block to block or tail to tail. Block pairs first, then tail pairs
  // (tail-local ids), in one upload.
  std::vector<BlockCopy> pairs;
  pairs.reserve(copies.size());
  int64_t num_block_pairs = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const BlockCopy& cp : copies) {
      const LocalCopy c = Localize(cp, from, to, what);
      if (c.tail == (pass == 1)) pairs.push_back({c.src, c.dst});
    }
    if (pass == 0) num_block_pairs = static_cast<int64_t>(pairs.size());
  }
  const int64_t n = static_cast<int64_t>(pairs.size());
  KV_RETURN_IF_ERROR(EnsureCopyCapacity(n));
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copies_uploaded));
  std::memcpy(copies_host.get(), pairs.data(), cuda::CopyListBytes(n));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies_dev.get(), copies_host.get(),
                                          cuda::CopyListBytes(n), cudaMemcpyHostToDevice, stream));
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_uploaded, stream));
  const int32_t* list = reinterpret_cast<const int32_t*>(copies_dev.get());
  const int L = config.num_layers;
  bool uniform = true;
  for (const KvFormat& f : formats) uniform &= f.block_bytes() == formats[0].block_bytes();
  // Blocks: one launch over every layer when they share a block size (the
  // regions are then [L][blocks][block_bytes]), else one per layer.
  for (int layer = 0; num_block_pairs > 0 && layer < L; ++layer) {
    cuda::CopyBlocksParams p;
    p.src = src + from.layer_offset[layer];
    p.dst = dst + to.layer_offset[layer];
    p.src_num_blocks = from.blocks;
    p.dst_num_blocks = to.blocks;
    p.num_layers = uniform ? L : 1;
    p.block_bytes = formats[layer].block_bytes();
    p.copies = list;
    p.num_copies = static_cast<int32_t>(num_block_pairs);
    KV_RETURN_IF_ERROR(cuda::CopyBlocks(p, stream));
    if (uniform) break;
  }
  // Tails: one launch per layer that keeps them.
  for (int layer = 0; n > num_block_pairs && layer < L; ++layer) {
    if (!formats[layer].has_tails()) continue;
    cuda::CopyBlocksParams p;
    p.src = src + from.tail_offset[layer];
    p.dst = dst + to.tail_offset[layer];
    p.src_num_blocks = from.tails;
    p.dst_num_blocks = to.tails;
    p.num_layers = 1;
    p.block_bytes = formats[layer].tail_block_bytes();
    p.copies = list + 2 * num_block_pairs;
    p.num_copies = static_cast<int32_t>(n - num_block_pairs);
    KV_RETURN_IF_ERROR(cuda::CopyBlocks(p, stream));
  }
  return absl::OkStatus();
}

bool CudaModelRunner::Impl::EvenLayers(const PoolShape& pool) const {
  const int L = config.num_layers;
  if (L < 2) return false;
  for (const KvFormat& f : formats) {
    if (f.block_bytes() != formats[0].block_bytes()) return false;
  }
  const std::vector<int64_t>& off = pool.layer_offset;
  for (int l = 2; l < L; ++l) {
    if (off[l] - off[l - 1] != off[1] - off[0]) return false;
  }
  return true;
}

absl::Status CudaModelRunner::Impl::CopyBlockLayers(const LayerSpan& dst, const LayerSpan& src,
                                                    cudaMemcpyKind kind, cudaStream_t on) {
  const int L = config.num_layers;
  const auto at = [&](const LayerSpan& x, int l, int64_t packed) {
    return x.pool == nullptr
               ? x.base + packed
               : x.base + x.pool->layer_offset[l] + int64_t(x.block) * formats[l].block_bytes();
  };
  const auto pitch = [&](const LayerSpan& x) {
    return x.pool == nullptr ? formats[0].block_bytes()
                             : x.pool->layer_offset[1] - x.pool->layer_offset[0];
  };
  const auto even = [&](const LayerSpan& x) { return x.pool == nullptr || EvenLayers(*x.pool); };
  if (L > 1 && even(dst) && even(src) && (dst.pool != nullptr || src.pool != nullptr)) {
    return CudaStatus(cudaMemcpy2DAsync(at(dst, 0, 0), pitch(dst), at(src, 0, 0), pitch(src),
                                        formats[0].block_bytes(), L, kind, on),
                      "a block's layers");
  }
  int64_t packed = 0;
  for (int l = 0; l < L; ++l) {
    const int64_t bb = formats[l].block_bytes();
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(at(dst, l, packed), at(src, l, packed), bb, kind, on));
    packed += bb;
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::TierCopies(std::span<const BlockId> blocks,
                                               uint8_t* const* host, bool out, const char* what) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId b = blocks[i];
    if (b < 0 || b >= pool_shape.blocks) {
      std::fprintf(stderr, "CudaModelRunner::%s: block %d of %d\n", what, b, pool_shape.blocks);
      std::abort();
    }
    const LayerSpan payload{host[i], nullptr, 0}, block{kv_pool.get(), &pool_shape, b};
    KV_RETURN_IF_ERROR(out ? CopyBlockLayers(payload, block, cudaMemcpyDeviceToHost, stream)
                           : CopyBlockLayers(block, payload, cudaMemcpyHostToDevice, stream));
  }
  return CudaStatus(cudaStreamSynchronize(stream), what);
}

// Swap copies on the copy engines, not the SMs: per block pair one
// cudaMemcpy2DAsync over every layer (CopyBlockLayers), tails one copy per
// layer that keeps them. Ordered after the compute stream's work so far and
// before what it enqueues next.
absl::Status CudaModelRunner::Impl::SwapCopies(std::span<const BlockCopy> copies, uint8_t* src,
                                               const PoolShape& from, uint8_t* dst,
                                               const PoolShape& to, cudaMemcpyKind kind,
                                               const char* what) {
  if (copies.empty()) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_ready, stream));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, compute_ready, 0));
  for (const BlockCopy& cp : copies) {
    const auto [tail, s, d] = Localize(cp, from, to, what);
    if (!tail) {
      KV_RETURN_IF_ERROR(CopyBlockLayers({dst, &to, d}, {src, &from, s}, kind, copy_stream));
      continue;
    }
    for (int layer = 0; layer < config.num_layers; ++layer) {
      if (!formats[layer].has_tails()) continue;
      const int64_t bb = formats[layer].tail_block_bytes();
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + to.tail_offset[layer] + int64_t(d) * bb,
                                              src + from.tail_offset[layer] + int64_t(s) * bb, bb,
                                              kind, copy_stream));
    }
  }
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_done, copy_stream));
  return CudaStatus(cudaStreamWaitEvent(stream, copies_done, 0), what);
}

// ---- ModelRunner ---------------------------------------------------------------

const ModelConfig& CudaModelRunner::config() const { return impl_->config; }
const KvFormat& CudaModelRunner::kv_format() const { return impl_->format; }
int32_t CudaModelRunner::num_blocks() const { return impl_->num_blocks; }
int32_t CudaModelRunner::num_swap_blocks() const { return impl_->num_swap_blocks; }
int32_t CudaModelRunner::num_tail_blocks() const { return impl_->num_tails; }
int32_t CudaModelRunner::num_swap_tail_blocks() const { return impl_->num_swap_tails; }
const RunnerMemoryInfo& CudaModelRunner::memory_info() const { return impl_->info; }
const CudaModelRunner::Counters& CudaModelRunner::counters() const { return impl_->counters; }
const std::vector<int32_t>& CudaModelRunner::graph_buckets() const { return impl_->buckets; }

absl::Status CudaModelRunner::Forward(const BatchInput& batch) {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return impl_->ForwardBatch(batch);
}

absl::Status CudaModelRunner::Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return impl_->SampleRows(rows, out);
}

absl::Status CudaModelRunner::ReadLogits(std::span<float> out) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t want = int64_t{std::max(0, m.last_logits_rows)} * m.config.vocab_size;
  if (static_cast<int64_t>(out.size()) < want) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits buffer has ", out.size(), " floats, the batch needs ", want));
  }
  if (want == 0) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), m.logits.get(), want * 4, cudaMemcpyDeviceToHost, m.stream));
  return CudaStatus(cudaStreamSynchronize(m.stream), "ReadLogits");
}

absl::Status CudaModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return m.RunCopies(copies, m.kv_pool.get(), m.pool_shape, m.kv_pool.get(), m.pool_shape,
                     "CopyBlocks");
}

absl::Status CudaModelRunner::SwapOut(std::span<const BlockCopy> copies) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return m.SwapCopies(copies, m.kv_pool.get(), m.pool_shape, m.swap_dev, m.swap_shape,
                      cudaMemcpyDeviceToHost, "SwapOut");
}

absl::Status CudaModelRunner::SwapIn(std::span<const BlockCopy> copies) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return m.SwapCopies(copies, m.swap_dev, m.swap_shape, m.kv_pool.get(), m.pool_shape,
                      cudaMemcpyHostToDevice, "SwapIn");
}

int64_t CudaModelRunner::tier_block_bytes() const {
  int64_t n = 0;
  for (const KvFormat& f : impl_->formats) n += f.block_bytes();
  return n;
}

absl::Status CudaModelRunner::ExportBlocks(std::span<const BlockId> blocks,
                                           std::span<uint8_t> out) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t per = tier_block_bytes();
  if (out.size() != blocks.size() * static_cast<size_t>(per)) {
    std::fprintf(stderr, "CudaModelRunner::ExportBlocks: %zu bytes for %zu blocks of %lld\n",
                 out.size(), blocks.size(), static_cast<long long>(per));
    std::abort();
  }
  std::vector<uint8_t*> host(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) host[i] = out.data() + i * per;
  return m.TierCopies(blocks, host.data(), /*out=*/true, "ExportBlocks");
}

absl::Status CudaModelRunner::ImportBlocks(std::span<const BlockId> blocks,
                                           std::span<const uint8_t* const> in) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  if (in.size() != blocks.size()) {
    std::fprintf(stderr, "CudaModelRunner::ImportBlocks: %zu payloads for %zu blocks\n", in.size(),
                 blocks.size());
    std::abort();
  }
  std::vector<uint8_t*> host(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) host[i] = const_cast<uint8_t*>(in[i]);
  return m.TierCopies(blocks, host.data(), /*out=*/false, "ImportBlocks");
}

// Slot moves (cuda::MoveSlots) take one page layout for every layer: one
// per-token dtype throughout, no int4_kc tails.
bool CudaModelRunner::supports_eviction() const {
  const Impl& m = *impl_;
  if (m.has_tails) return false;
  for (const KvFormat& f : m.formats) {
    if (f.dtype() != m.format.dtype()) return false;
  }
  return true;
}

absl::Status CudaModelRunner::MoveSlots(std::span<const SlotMove> moves) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  if (!supports_eviction()) {
    return absl::UnimplementedError(
        "KV slot moves need one per-token cache.kv_dtype in every layer (no int4_kc)");
  }
  return m.RunMoves(moves);
}

absl::Status CudaModelRunner::ReadAttentionStats(std::span<float> out) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t n = m.ev.active && m.ev.mass ? m.ev.num_stats : 0;
  if (static_cast<int64_t>(out.size()) < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention stats buffer has ", out.size(), " floats, the batch recorded ", n));
  }
  if (n == 0) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), m.attn_stats.get(), n * 4, cudaMemcpyDeviceToHost, m.stream));
  return CudaStatus(cudaStreamSynchronize(m.stream), "ReadAttentionStats");
}

absl::Status CudaModelRunner::Synchronize() {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return CudaStatus(cudaStreamSynchronize(impl_->stream), "Synchronize");
}

absl::StatusOr<std::vector<uint8_t>> CudaModelRunner::ReadBlock(int layer, int32_t block) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= m.config.num_layers || block < 0 || block >= m.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadBlock: layer ", layer, " block ", block, " is outside the pool"));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t block_bytes = m.formats[layer].block_bytes();
  std::vector<uint8_t> out(block_bytes);
  const uint8_t* src = m.kv_pool.get() + m.pool_shape.layer_offset[layer] + block * block_bytes;
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), src, out.size(), cudaMemcpyDeviceToHost, m.stream));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
  return out;
}

}  // namespace kvserve
