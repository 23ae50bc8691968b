// Launcher of MeasureReadBandwidth: allocates, times with events, frees.
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/read_bandwidth.h"
#include "kernels/cuda/read_bandwidth_kernel.cuh"

namespace kvserve::cuda {
namespace {

struct Freer {
  void operator()(void* p) const { cudaFree(p); }
};
struct EventDestroyer {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
using Event = std::unique_ptr<CUevent_st, EventDestroyer>;

absl::StatusOr<Event> NewEvent() {
  cudaEvent_t e = nullptr;
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  return Event(e);
}

}  // namespace

absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, int iters, cudaStream_t stream) {
  bytes = bytes / 16 * 16;
  if (bytes <= 0 || iters < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MeasureReadBandwidth: bytes and iters must be positive, got ", bytes, ", ", iters));
  }
  int device = 0, sms = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  void* raw = nullptr;
  KV_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, bytes + 16));
  const std::unique_ptr<void, Freer> data(raw);
  uint32_t* sink = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(raw) + bytes);
  KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(raw, 1, bytes, stream));
  KV_ASSIGN_OR_RETURN(Event start, NewEvent());
  KV_ASSIGN_OR_RETURN(Event stop, NewEvent());
  std::vector<float> ms;
  const int64_t n = bytes / 16;
  const dim3 grid(static_cast<unsigned>(4 * sms));
  for (int i = 0; i <= iters; ++i) {  // pass 0 warms up
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
    LaunchKernel(read_bandwidth_detail::StreamReadKernel, grid, 512, 0, stream,
                 static_cast<const uint4*>(raw), n, 0x9e3779b9u, sink);
    KV_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
    KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
    float t = 0;
    KV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start.get(), stop.get()));
    if (i > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median_s = ms[ms.size() / 2] * 1e-3;
  return static_cast<double>(bytes) / median_s / 1e9;
}

}  // namespace kvserve::cuda
