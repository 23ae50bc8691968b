// The device's achievable read bandwidth, measured with a plain streaming
// read: every byte of a buffer far larger than L2 is loaded once with
// 16-byte loads (grid-stride, one running XOR per thread written out so the
// loads cannot be dropped). The benchmarks divide the bytes a step must read
// by this number to get their roofline step time.
//
// Thread-safety: allocates its own buffer; synchronises the stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace kvserve::cuda {

// GB/s (10^9 bytes per second), the median of `iters` timed passes over
// `bytes` (rounded down to a multiple of 16) after one warm-up pass.
absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, int iters, cudaStream_t stream);

}  // namespace kvserve::cuda
