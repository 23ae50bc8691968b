// Rotary position embedding on the GPU, in place on the query and key heads
// of every token, interleaved (llama2.c: pairs (2j, 2j+1)) or neox (HF
// rotate-half: pairs (j, j + head_dim/2)), exactly as cpu::ApplyRope.
//
// The angles come as a table, not as a formula: cos and sin are device
// copies of a cpu::RopeTable (kernels/cpu/layers/ops.h), each [max_positions]
// [head_dim / 2] floats (upload table.cos(0) and table.sin(0), which are
// contiguous, max_positions() * half_dim() floats each). RoPE variants
// (theta, Llama-3.1 "llama3", linear, dynamic scaling) are computed on the
// host when the table is built, so they need no kernel change, and the
// rotation uses the CPU's very numbers.
//
// Arithmetic: v0 * cos - v1 * sin and v0 * sin + v1 * cos with each product
// and the sum rounded separately (no FMA), as the CPU computes them; for fp32
// activations the result equals cpu::ApplyRope bit for bit. fp16/bf16 are
// widened exactly, rotated in fp32 and rounded once.
//
// Positions: positions[t] (the device BatchView's positions) must lie in
// [0, max_positions), or past it with row_cos / row_sin given; the runner
// checks them on the host before upload. A token whose position is outside
// gets NaN in all its q and k values instead of an out-of-bounds read.
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

enum class RopeStyle : uint8_t { kInterleaved, kNeox };

struct RopeParams {
  // Token t's query head h is q[t * q_stride + h * head_dim + i], i <
  // head_dim (q may point into a fused QKV row); likewise k.
  void* q = nullptr;                   // [num_tokens][q_stride] (ActDtype), device; null: no q
  void* k = nullptr;                   // [num_tokens][k_stride] (ActDtype), device; null: no k
  int64_t q_stride = 0;                // elements; 0: num_q_heads * head_dim
  int64_t k_stride = 0;                // elements; 0: num_kv_heads * head_dim
  const int32_t* positions = nullptr;  // [num_tokens], device
  const float* cos = nullptr;          // [max_positions][head_dim / 2], device
  const float* sin = nullptr;          // [max_positions][head_dim / 2], device
  int32_t max_positions = 0;
  // Optional, for positions past the table (KV eviction runs sequences past
  // max_position_embeddings): token t with positions[t] >= max_positions
  // takes cos/sin from row t of these, [num_tokens][head_dim / 2] each,
  // computed on the host as the CPU computes them (model/cpu/cpu_forward.cc
  // RopeAt), so the rotation stays bitwise the CPU's. Null: such tokens get
  // NaN as below.
  const float* row_cos = nullptr;
  const float* row_sin = nullptr;
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // even
  RopeStyle style = RopeStyle::kNeox;
  ActDtype dtype = ActDtype::kFp32;
};

// InvalidArgument naming the field for bad sizes or pointers; otherwise
// the launch's status. num_tokens == 0 launches nothing.
absl::Status ApplyRope(const RopeParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
