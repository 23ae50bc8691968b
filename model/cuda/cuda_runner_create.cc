// CudaModelRunner: Create (the device, the sizes, the streams), the
// activations and workspaces, the profile run that measures them, and the KV
// pools sized from what it leaves (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "cache/sizing/kv_pool_plan.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/kv/copy_blocks.h"
#include "kernels/cuda/layers/gemm.h"
#include "kernels/cuda/sampling/sample.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "kernels/plan/sampling_batch.h"
#include "model/cuda/cuda_runner_impl.h"
#include "model/cuda/host/batch_staging.h"
#include "model/cuda/host/graph_buckets.h"
#include "model/loader/quantize_weights.h"
#include "model/runner_factory.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::ActDtype;
using cuda::CudaStatus;

constexpr int64_t kMiB = int64_t{1} << 20;
// Kept free beside the KV pool: graph instantiation, the driver's own
// growth, fragmentation.
constexpr int64_t kReserveBytes = 512 * kMiB;

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

}  // namespace

// ---- Memory ------------------------------------------------------------------

absl::StatusOr<DeviceBuffer> DeviceAlloc(int64_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, absl::StrCat("cudaMalloc of ", bytes, " bytes for ", what).c_str());
  }
  return DeviceBuffer(static_cast<uint8_t*>(p));
}

absl::StatusOr<HostBuffer> PinnedAlloc(int64_t bytes, const std::string& what, unsigned flags) {
  void* p = nullptr;
  const cudaError_t e =
      cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)), flags);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, absl::StrCat("cudaHostAlloc of ", bytes, " bytes for ", what).c_str());
  }
  return HostBuffer(static_cast<uint8_t*>(p));
}

PoolShape PlanPoolShape(const std::vector<KvFormat>& formats, int32_t blocks, int32_t tails) {
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
  if (tier_exported != nullptr) cudaEventDestroy(tier_exported);
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
  m.weight_quant = weights.weight_quant.Resolve(c.vocab_size);
  if (m.weight_quant.fp8()) {
    // "fp8_e4m3" when the head is too, else which of the two is fp8.
    auto name = [&](WeightQuant q) {
      return std::string(q == WeightQuant::kFp8E4m3 ? WeightQuantName(q) : WeightDtypeName(dtype));
    };
    m.info.weight_dtype = name(m.weight_quant.body);
    if (m.weight_quant.head != m.weight_quant.body) {
      m.info.weight_dtype += "+head " + name(m.weight_quant.head);
    }
    // What quantizing at load took (on the host; none for a checkpoint
    // shipped in fp8, whose seconds are 0, or a dummy model made on the device).
    if (const QuantizedLinears* q = weights.quantized.get(); q != nullptr && q->seconds > 0) {
      m.info.quantized_weights = q->num_weights;
      m.info.quantize_seconds = q->seconds;
      m.info.quantize_threads = q->threads;
    }
  } else {
    m.info.weight_dtype = std::string(WeightDtypeName(dtype));
  }
  m.info.num_swap_blocks = options.num_swap_blocks;

  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.batch_uploaded, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.copies_uploaded, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.ev_uploaded, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m.copy_stream, cudaStreamNonBlocking));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.compute_ready, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.copies_done, cudaEventDisableTiming));
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m.tier_exported, cudaEventDisableTiming));
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
  if (weight_quant.fp8()) {
    int64_t widest = wl.lm_head.ld;
    for (const DeviceLayerWeights& lw : wl.layers) {
      widest = std::max({widest, lw.wqkv.ld, lw.wo.ld, lw.w_gate_up.ld, lw.w_down.ld});
    }
    KV_ASSIGN_OR_RETURN(act_q, DeviceAlloc(T * widest, "activations (fp8 GEMM inputs)"));
    KV_ASSIGN_OR_RETURN(act_scale, DeviceAlloc(T * 4, "activations (fp8 GEMM scales)"));
  }

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

absl::Status CudaModelRunner::Impl::ReallocateUpload(HostBuffer& host, DeviceBuffer& dev,
                                                     int64_t& capacity, int64_t new_capacity,
                                                     int64_t bytes, const char* what) {
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  host.reset();
  dev.reset();
  capacity = 0;
  KV_ASSIGN_OR_RETURN(host, PinnedAlloc(bytes, what));
  KV_ASSIGN_OR_RETURN(dev, DeviceAlloc(bytes, what));
  capacity = new_capacity;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::EnsureSampleCapacity(int64_t bytes) {
  if (bytes <= sample_capacity) return absl::OkStatus();
  const int64_t want = std::max(bytes, 2 * sample_capacity);
  return ReallocateUpload(sample_host, sample_dev, sample_capacity, want, want,
                          "the sampling upload");
}

absl::Status CudaModelRunner::Impl::EnsureCopyCapacity(int64_t pairs) {
  if (pairs <= copies_capacity) return absl::OkStatus();
  const int64_t want = std::max(pairs, 2 * copies_capacity);
  return ReallocateUpload(copies_host, copies_dev, copies_capacity, want, cuda::CopyListBytes(want),
                          "the block copy list");
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

}  // namespace kvserve
