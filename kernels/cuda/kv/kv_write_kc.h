// int4_kc and int2_kc KV writes on the GPU (cache/format/kv_layout.h has the layout and the
// per-step contract; kernels/cpu/attention/paged_attention.h the CPU's two calls). Per
// layer and step:
//   SealKvBlocks -> PagedAttentionKc -> WriteKvTails
// SealKvBlocks (before attention) quantizes every block the step completes
// (first / bs <= k < context_len / bs) in one go into block_table[b][k]: K
// per channel over the block, V int4 (int2_kc: 2-bit) per token, from the block's rows (the
// sequence's fp16 tail before its first new index, this step's K/V after,
// rounded to fp16 as the tail would hold them). WriteKvTails (after
// attention) stores this step's rows of each sequence's final partial block
// (context_len / bs * bs <= index) into its tail at slot index % bs, as fp16
// (saturated to +-65504).
//
// Bytes: for the same rows every byte equals what cpu::FlushKvBlocks /
// cpu::WriteKvTails write on a layout with fp16 tails (KvFormat::Create(...,
// KvElem::kFp16)): the seal is kernels/cpu/kv/kv_quant_kc.cc's scalar encoder
// transcribed operation for operation (exact_math.cuh), V rows go through
// kv_encode.cuh's int4 encoder.
//
// Launch shapes do not depend on the batch's contents (only on num_seqs and
// num_tokens, host values), so both calls can be captured in a CUDA graph
// with capacities: sequences with no rows and rows past query_start[num_seqs]
// do nothing. A sequence whose block needs its tail but has tail_ids[b] < 0
// is skipped (the CPU aborts; here the batch builder guarantees tails).
//
// Thread-safety: stateless; work is enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/paged_view.h"

namespace kvserve::cuda {

struct KvKcWriteParams {
  // This step's rows: token t's values for kv head h are
  // k[t * k_stride + h * head_dim + i] (ActDtype), device memory.
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride = 0;  // elements; 0: num_kv_heads * head_dim
  int64_t v_stride = 0;
  ActDtype dtype = ActDtype::kFp32;
  // Device pointers: query_start, context_len, block_table, tail_ids; the
  // counts num_seqs, num_tokens, max_blocks_per_seq are host values.
  BatchView batch;
  // One layer whose layout keeps fp16 tails (device pages and tails).
  PagedKvView kv;
};

// InvalidArgument naming the field for a layout that is not int4_kc or
// int2_kc with fp16 tails, a bad stride or a null pointer; otherwise the
// launch's status.
absl::Status SealKvBlocks(const KvKcWriteParams& params, cudaStream_t stream);
absl::Status WriteKvTails(const KvKcWriteParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
