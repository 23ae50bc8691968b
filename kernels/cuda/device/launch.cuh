// kernels/cuda/device/: the device code every kernel folder shares: the launch
// macro, activation dtypes and conversions, exact fp32 math, the KV encoders
// and decoders, tensor-core fragments, Philox and the CUDA error checks.
//
// One launch for every kernel in kernels/cuda/: a real `<<<>>>` under nvcc,
// and under the CUDA stand-in (tests/cuda_stub, KVSERVE_CUDA_STUB) a launch
// the simulator queues on the stream and later runs on the CPU, so the same
// launcher source compiles both ways.
//
//   KV_RETURN_IF_ERROR(CudaStatus(
//       LaunchKernel(RmsNormKernel<T, true>, grid, threads, 0, stream, p, vectorized), "..."));
//
// The arguments are converted to the kernel's parameter types at the call,
// as `<<<>>>` converts them (and copied: a graph captured here replays these
// values). Returns cudaGetLastError's value for the launch, which also stays
// readable through cudaGetLastError.
#pragma once

#include <cuda_runtime.h>

#if defined(KVSERVE_CUDA_STUB)
#include "tests/cuda_stub/cuda_stub_launch.h"
#endif

namespace kvserve::cuda {

template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t dynamic_smem,
                         cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "a kernel argument is missing");
#if defined(KVSERVE_CUDA_STUB)
  return ::cuda_stub::Launch(kernel, grid, block, dynamic_smem, stream,
                             static_cast<Params>(static_cast<Args&&>(args))...);
#else
  // clang-format reads <<< >>> in a .cuh as templates.
  // clang-format off
  kernel<<<grid, block, dynamic_smem, stream>>>(static_cast<Args&&>(args)...);
  // clang-format on
  return cudaPeekAtLastError();
#endif
}

}  // namespace kvserve::cuda
