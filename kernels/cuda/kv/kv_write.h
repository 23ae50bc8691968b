// kernels/cuda/kv/: the kernels that write and move KV pages (write and
// quantize, int4_kc blocks and tails, block copies and swaps, eviction's slot
// moves); their CPU pairs are kernels/cpu/kv/.
//
// KV write + quantize on the GPU: each new token's K and V (the projection
// outputs, after RoPE) are encoded per the cache's KvFormat and stored at the
// slot slot_mapping names, in one layer of the paged cache.
//
// Bytes: for the same fp32 input every page byte written equals what
// cpu::WriteKv writes (kernels/cpu/kv/kv_quant.h's encodings, reproduced bit for
// bit by kernels/cuda/device/kv_encode.cuh: zero differing bytes is the tested
// bound; kv_encode.cuh names the two corners, NaN rows and a -0/+0 int4
// minimum, where only the CPU's scalar path is matched). fp16/bf16
// activations are widened to fp32 exactly first, so they equal cpu::WriteKv
// on the widened values. Bytes of the page that no row owns (alignment
// padding) are never touched.
//
// Slots: a negative slot skips the token (padding rows); a slot at or past
// kv.num_blocks * block_size is skipped too (the kernel never writes out of
// the pool; the batch builder is what guarantees valid slots). Two tokens
// must not name the same slot (their rows would race).
//
// Thread-safety: stateless; the work is enqueued on `stream` and the call
// does not synchronise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/paged_view.h"

namespace kvserve::cuda {

struct KvWriteParams {
  // Token t's values for kv head h are k[t * k_stride + h * head_dim + i],
  // i < head_dim (so k may point into a fused QKV row).
  const void* k = nullptr;                // [num_tokens][k_stride] (ActDtype), device
  const void* v = nullptr;                // [num_tokens][v_stride] (ActDtype), device
  int64_t k_stride = 0;                   // elements; 0: num_kv_heads * head_dim
  int64_t v_stride = 0;                   // elements; 0: num_kv_heads * head_dim
  const int64_t* slot_mapping = nullptr;  // [num_tokens], device; negative: skip
  int32_t num_tokens = 0;
  PagedKvView kv;  // one layer; kv.pages is device memory [num_blocks][block_bytes]
  ActDtype dtype = ActDtype::kFp32;
};

// InvalidArgument naming the field for a bad layout, stride or pointer
// (head_dim must be even and at most 512; int4 groups must divide it);
// otherwise the launch's status. num_tokens == 0 launches nothing.
absl::Status WriteKv(const KvWriteParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
