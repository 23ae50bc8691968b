// Device side of MeasureReadBandwidth (read_bandwidth.h).
// Grid: (4 x SM count), block 512; each thread XORs the uint4s it reads.
#pragma once

#include <cstdint>

namespace kvserve::cuda::read_bandwidth_detail {

__global__ void StreamReadKernel(const uint4* __restrict__ data, int64_t n, uint32_t magic,
                                 uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint4 v = __ldcs(data + i);  // streaming: do not keep in cache
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  // Stored only when it equals a value the compiler cannot know (and the
  // data never produces), so the loads stay live without a store per thread.
  if (acc == magic) sink[0] = acc;
}

}  // namespace kvserve::cuda::read_bandwidth_detail
