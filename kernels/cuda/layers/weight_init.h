// Filling the device weight arena at load (model/cuda/host/device_weight_layout.h):
// converting fp32 values already on the device to the model dtype, or
// generating a dummy model's weights in place (kernels/random_weights.h) so
// that an 8B dummy model never exists in host memory, or writing ones (dummy
// norm weights). Each element is rounded once, to nearest even, so the
// device holds exactly what converting the host's fp32 values would give.
//
// Thread-safety: stateless; the work is enqueued on `stream` and the call
// does not synchronise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

enum class WeightSource : uint8_t { kFp32, kDummy, kOnes };

struct WeightFillParams {
  void* dst = nullptr;  // [n] in dtype, device
  int64_t n = 0;
  ActDtype dtype = ActDtype::kFp32;
  WeightSource source = WeightSource::kFp32;
  const float* src = nullptr;  // kFp32: [n] fp32, device; must not overlap dst
  uint64_t dummy_key = 0;      // kDummy: DummyStreamKey(seed)
  int64_t dummy_index = 0;     // kDummy: stream element of dst[0]
};

// InvalidArgument naming the field for a bad size, pointer or source;
// otherwise the launch's status. n == 0 launches nothing.
absl::Status FillWeights(const WeightFillParams& params, cudaStream_t stream);

}  // namespace kvserve::cuda
