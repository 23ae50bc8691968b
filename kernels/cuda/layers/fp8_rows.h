// QuantizeRowsFp8: rows of bf16 / fp16 activations -> e4m3 codes with one
// fp32 scale a row, the x operand of an fp8 GEMM (kernels/cuda/layers/gemm.h:
// per-token activation scales against per-channel weight scales). Per row:
//   scale = max |x| / 448,  q[c] = e4m3(x[c] / scale)   (round to nearest
//   even, saturating at +-448), q[c] = 0 for c in [cols, ldq)
// and a row with no finite positive max (zeros) gets scale 0 and zero
// codes. The rule is the host weight quantizer's (model/loader/
// quantize_weights.h, Fp8Matrix), on the element codec of the fp8 KV
// format (kernels/cuda/device/kv_encode.cuh), so the device's bytes are the CPU's
// for the same inputs. A row's codes depend on that row only (batch
// invariance: no scale is shared across rows).
//
// Thread-safety: stateless; the work is enqueued on the given stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

struct Fp8RowsParams {
  const void* x = nullptr;  // [rows][ldx], dtype, device
  uint8_t* q = nullptr;     // [rows][ldq] e4m3 codes, device
  float* scale = nullptr;   // [rows], device
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ldx = 0;                   // elements; 0: cols
  int64_t ldq = 0;                   // bytes; 0: cols rounded up to a multiple of 16
  ActDtype dtype = ActDtype::kBf16;  // bf16 or fp16
};

// InvalidArgument naming the field for a bad shape, stride, dtype or null
// pointer; otherwise the launch's status. rows == 0 launches nothing.
absl::Status QuantizeRowsFp8(const Fp8RowsParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
