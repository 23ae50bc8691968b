// Paged attention on the GPU over int4_kc and int2_kc layers (a layout with fp16
// tails; cache/format/kv_layout.h states which keys a row reads from where): row
// r at cache index i reads keys of earlier blocks (j / bs < i / bs) from
// their sealed int4_kc blocks and the keys of its own block in full
// precision, from its sequence's tail (j < first) or from this step's K/V
// (j >= first, rounded to fp16 as the tail will hold them). Runs after
// SealKvBlocks and before WriteKvTails (kv_write_kc.h). Same semantics,
// plan, workspace and output as cuda::PagedAttention (paged_attention.h),
// which it mirrors; numerics equal cpu::PagedAttention on the same pages up
// to fp32 accumulation order (decoded K/V values are bitwise the CPU's).
//
// Thread-safety: stateless; work is enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/attention/paged_attention.h"

namespace kvserve::cuda {

struct PagedAttentionKcParams {
  // Everything as for PagedAttention; kv.layout must be int4_kc or int2_kc with fp16
  // tails and kv.tails set; batch.tail_ids (device) names each sequence's tail.
  PagedAttentionParams attn;
  // This step's K and V rows (RoPE applied), of attn.dtype: token t's kv
  // head h at t * stride + h * head_dim. Stride 0: num_kv_heads * head_dim.
  const void* new_k = nullptr;
  const void* new_v = nullptr;
  int64_t new_k_stride = 0;
  int64_t new_v_stride = 0;
};

// InvalidArgument naming the field as PagedAttention does, plus for a layout
// that is not int4_kc with fp16 tails or null tails/tail_ids/new_k/new_v.
absl::Status PagedAttentionKc(const PagedAttentionKcParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
