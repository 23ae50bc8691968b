// CUDA runtime errors as absl::Status, for the host side of kernels/cuda/.
// Every launcher ends with CudaStatus(cudaGetLastError(), ...) so a bad
// launch becomes a value the caller can report, never an abort.
//
//   KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream));
//
// Codes: out of device memory is ResourceExhausted (the scheduler answers it
// like a full block pool); a missing device or driver is FailedPrecondition;
// anything else is Internal (a kernel or launch bug).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve::cuda {

inline absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace kvserve::cuda

#define KV_CUDA_RETURN_IF_ERROR(...) \
  KV_RETURN_IF_ERROR(::kvserve::cuda::CudaStatus((__VA_ARGS__), #__VA_ARGS__))
