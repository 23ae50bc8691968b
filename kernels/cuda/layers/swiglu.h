// SwiGLU on the GPU: out[t][i] = silu(gate[t][i]) * up[t][i] with
// silu(g) = g / (1 + e^-g), over the fused gate/up projection output.
//
// Layout of gate_up (one GEMM with the gate and up weights stacked):
// row t is [gate (hidden values)][up (hidden values)], gate FIRST, so
// gate[t][i] = gate_up[t * gate_up_stride + i] and
// up[t][i] = gate_up[t * gate_up_stride + hidden + i].
//
// Arithmetic: the very operations of cpu::SiluMul's AVX2 path (its Cephes
// e^x polynomial with the same clamps and FMAs, then g * (1 / (1 + e)) * u),
// so for fp32 activations the result equals cpu::SiluMul bit for bit on a
// CPU that runs that path (any AVX2 host); the CPU's scalar fallback uses
// libm's expf and may differ by an ulp or two. fp16/bf16 are widened
// exactly, computed in fp32 and rounded once.
//
// Aliasing: out may equal gate_up (in place, each element is read and
// written by one thread); otherwise they must not overlap.
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

struct SwiGluParams {
  const void* gate_up = nullptr;  // [num_tokens][gate_up_stride] (ActDtype), device
  void* out = nullptr;            // [num_tokens][out_stride] (ActDtype), device
  int64_t num_tokens = 0;
  int64_t hidden = 0;          // intermediate size
  int64_t gate_up_stride = 0;  // elements; 0: 2 * hidden
  int64_t out_stride = 0;      // elements; 0: hidden
  ActDtype dtype = ActDtype::kFp32;
};

// InvalidArgument naming the field for bad sizes or pointers; otherwise the
// launch's status. num_tokens == 0 launches nothing.
absl::Status SwiGlu(const SwiGluParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
