// The simulated side of kernels/cuda/device/launch.cuh: a launch becomes one queued
// operation on its stream (or a node of the graph being captured) that runs
// every CTA of the grid on the CPU through cuda_sim's fibers when the stream
// is next synchronised. The arguments are copied into the operation here,
// which is what a graph captured around the launch replays.
//
// Built into the launchers only in the stand-in build (KVSERVE_CUDA_STUB),
// after cuda_sim_more.h, which every simulated launcher includes first.
#pragma once

// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim_more.h"
// clang-format on

#include <cuda_runtime.h>

#include <functional>

namespace cuda_stub {

// Checks the launch against the device's limits (cudaErrorInvalidConfiguration
// for the block and grid, cudaErrorInvalidValue for dynamic shared memory
// over what the kernel's attribute allows), then queues it. `cta` runs one
// thread of the CTA that cuda_sim's globals name.
cudaError_t EnqueueLaunch(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem,
                          cudaStream_t stream, std::function<void()> cta);

// A host-side operation queued on `stream` like a kernel (the cuBLASLt
// stand-in's GEMM). Runs with device memory accessible.
cudaError_t EnqueueOp(cudaStream_t stream, std::function<void()> op);
// Whether [p, p + bytes) lies inside one device or pinned allocation.
bool IsDeviceRange(const void* p, size_t bytes);

template <typename... Params>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t dynamic_smem,
                   cudaStream_t stream, Params... args) {
  return EnqueueLaunch(reinterpret_cast<const void*>(kernel), grid, block, dynamic_smem, stream,
                       [kernel, args...] { kernel(args...); });
}

}  // namespace cuda_stub

// cuda_runtime.h declares this overload for nvcc only.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
