// Paged attention on the GPU over every KvFormat: causal attention of each
// query row of a flattened batch (decode rows, prefill chunks, prompts after
// a prefix-cache hit, all mixed) over its sequence's cached K/V, read through
// the block table and dequantized in registers. Same semantics as
// kvserve::cpu::PagedAttention: row r of sequence b sits at cache index
// i = batch.CacheIndex(b, r) and attends to [KeyBegin(i, sliding_window), i]
// (kernels/paged_view.h); GQA maps query head h to kv head h / group.
//
// The work is cut on the host by kernels/plan/gpu_attention_plan.h (tiles of rows
// that share every K/V page they read, split-KV partitions for long
// contexts); the caller uploads the plan's words() and passes the device
// copy here. Two launches: the attention kernel (grid: items x head chunks)
// writes each unsplit row to `out` and each partition's (max, sum, acc) to
// the workspace; a merge kernel combines the partitions of split rows.
//
// q and out are fp32, fp16 or bf16 (ActDtype, converted at load and store);
// scores, softmax and accumulation are fp32. Each output element is rounded
// once to the storage type.
//
// Thread-safety: stateless; the work is enqueued on the given stream and the
// call does not synchronise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/paged_view.h"
#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve::cuda {

// Which attention kernel runs (model.attention_kernel). kFast: the
// tensor-core kernel (paged_attention_mma_kernel.cuh) where it takes the
// layout (fp16, bf16, fp8_e4m3, int8, int4, k8v4 pages; head_dim 64, 128,
// 256; power-of-two block sizes), else the reference kernel; kReference:
// always the simple kernel (paged_attention_kernel.cuh), to compare or fall
// back to.
enum class AttentionKernel : int32_t { kFast = 0, kReference = 1 };

struct PagedAttentionParams {
  // [num_tokens][q_stride]: head h of row t at t * q_stride + h * head_dim;
  // RoPE applied. q_stride 0 means num_heads * head_dim.
  const void* q = nullptr;
  // [num_tokens][out_stride], same indexing; must not overlap q.
  void* out = nullptr;
  int64_t q_stride = 0;    // elements
  int64_t out_stride = 0;  // elements
  ActDtype dtype = ActDtype::kFp32;

  // One layer of the device pool: pages [num_blocks][layout.block_bytes].
  PagedKvView kv;
  // Device pointers: query_start [num_seqs + 1], context_len [num_seqs],
  // block_table [num_seqs][max_blocks_per_seq]; the counts are host values.
  // token_ids, positions, slot_mapping and logits_rows are not read.
  BatchView batch;

  int32_t num_heads = 0;       // query heads; a multiple of kv.layout.num_kv_heads
  float scale = 0.0f;          // usually 1 / sqrt(head_dim)
  int32_t sliding_window = 0;  // 0: full causal attention

  // Device copy of GpuAttentionPlan::words() (4-byte aligned), made for this
  // batch and for {num_heads, num_kv_heads, head_dim, sliding_window}.
  const int32_t* plan = nullptr;
  // Host copy of its counts. For CUDA graph replay these may be capacities
  // (at least the uploaded counts): CTAs past the uploaded counts exit.
  GpuAttentionLaunch launch;
  // Device scratch of at least GpuAttentionWorkspaceBytes(shape,
  // launch.num_partials) bytes, 8-byte aligned; null when num_partials is 0.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;

  // Optional, for KV eviction (cache/eviction/eviction_policy.h), with the contract
  // of cpu::PagedAttentionParams; all null: off (the kernels then do no
  // extra work beyond a branch per CTA).
  // Sinks: a row of sequence b scores keys at cache indices below
  // num_sinks[b] with its sink_q row ([num_tokens][q_stride] like q, RoPE
  // applied at the row's cache index) instead of q. Both or neither.
  const void* sink_q = nullptr;
  const int32_t* num_sinks = nullptr;  // [num_seqs], device
  // Mass: row r with key_mass_offset[r] >= 0 gets at key_mass[
  // key_mass_offset[r] + (j - KeyBegin(i))] the softmax weight of key j
  // summed over its query heads. Needs softmax_stats, device scratch of
  // [num_tokens][num_heads][2] floats (each head's final max and sum), which
  // the attention and merge kernels fill; a third launch (one CTA per row)
  // then recomputes each recorded key's score. All three or none.
  float* key_mass = nullptr;
  const int64_t* key_mass_offset = nullptr;  // [num_tokens], device
  float* softmax_stats = nullptr;

  AttentionKernel kernel = AttentionKernel::kFast;
  // > 0: the attention grid holds only the CTAs that fit on num_sms SMs at
  // once (by shared memory), each walking items x, x + grid, ... of the
  // plan: a captured decode graph sized for a capacity then launches no
  // CTAs that exit at once. 0: one CTA per item (launch.num_items).
  int32_t num_sms = 0;
};

// Whether PagedAttention runs the fast kernel for these params.
bool UsesFastAttention(const PagedAttentionParams& params);

// The shape the plan for these params must be made with.
GpuAttentionShape ShapeOf(const PagedAttentionParams& params);

// InvalidArgument naming the field for a bad shape, stride, pointer, plan
// size or an unsupported K/V element pair; otherwise the launch's status.
// launch.num_items == 0 launches nothing.
absl::Status PagedAttention(const PagedAttentionParams& params, cudaStream_t stream);

// One layer's attention statistics from PagedAttention's key_mass: for each
// sequence b with stats_offset[b] >= 0 (the offset of this layer's row,
// [context_len[b]] floats), out[stats_offset[b] + j] = the sum over b's rows,
// in row order, of the row's mass of key j; 0 for keys no row attends. The
// CPU runner's order of additions (model/cpu/cpu_forward.cc
// GatherAttentionStats), so equal masses give equal statistics.
struct GatherMassParams {
  BatchView batch;  // device query_start, context_len, block_table... as above
  int32_t sliding_window = 0;
  const float* key_mass = nullptr;
  const int64_t* key_mass_offset = nullptr;  // [num_tokens], device
  const int64_t* stats_offset = nullptr;     // [num_seqs], device
  float* out = nullptr;
};
absl::Status GatherAttentionMass(const GatherMassParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
