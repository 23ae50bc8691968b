// Test controls of the CUDA runtime stand-in (tests/cuda_stub/runtime.cc),
// which implements the cuda* calls kvserve makes on the CPU for make test:
//
//   - device memory lives in its own mappings, PROT_NONE except while a copy,
//     memset or kernel runs, with a guard page right after each allocation:
//     host code touching device memory, and a kernel reading past an
//     allocation, fault;
//   - each stream is a queue that runs only where the real API orders the
//     host after it (cudaStreamSynchronize, cudaEventSynchronize,
//     cudaDeviceSynchronize, a synchronous copy on a blocking stream, a
//     device-to-pageable copy): a missing synchronisation reads stale data;
//   - stream capture records each operation with its arguments (a kernel's
//     by value, a pinned copy's pointers); a graph launch queues them again;
//     calls the real API refuses while capturing return its error and
//     invalidate the capture;
//   - the device is an H200 (cudaGetDeviceProperties), with its launch
//     limits; its memory is the simulated capacity below, since the host
//     cannot back 141 GB.
//
// Thread-safety: one mutex around the whole runtime; kernels run on the
// thread that synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cuda_stub {

// Device memory cudaMemGetInfo reports (total; free is total minus live
// allocations). Default 4 GiB.
void SetDeviceMemoryBytes(size_t total);
// The `n`-th cudaMalloc from now (0: the next) returns
// cudaErrorMemoryAllocation; -1 turns it off.
void FailMallocAfter(int n);
// The next cudaMemGetInfo returns `error` (cudaSuccess turns it off).
void FailNextMemGetInfo(cudaError_t error);

struct Counters {
  int64_t live_device_allocations = 0;
  int64_t live_device_bytes = 0;
  int64_t live_host_allocations = 0;
  int64_t kernels_run = 0;
  int64_t graphs_launched = 0;
  // cudaMemcpyAsync / cudaMemcpy2DAsync calls with pageable host memory on
  // one side (staged or waited for, never asynchronous).
  int64_t pageable_copies = 0;
};
Counters GetCounters();

// Operations queued on `stream` and not yet run.
int64_t PendingOps(cudaStream_t stream);

}  // namespace cuda_stub
