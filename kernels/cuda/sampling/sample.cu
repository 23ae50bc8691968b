// Launcher of SampleTokens: validates the Params and launches the one
// instantiation (the logits dtype is a runtime switch inside the row copy,
// the only place that reads the logits in bulk).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/sampling/sample.h"
#include "kernels/cuda/sampling/sample_kernel.cuh"

namespace kvserve::cuda {
namespace {

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("SampleTokens: ", field, " must be ", rule, ", got ", value));
}

int64_t Align256(int64_t x) { return (x + 255) / 256 * 256; }

}  // namespace

SampleWorkspaceLayout SampleWorkspaceFor(int32_t max_rows, int32_t vocab) {
  SampleWorkspaceLayout l;
  const int64_t region = Align256(static_cast<int64_t>(max_rows) * vocab * 4);
  l.processed_offset = 0;
  l.counts_offset = region;
  l.bytes = 2 * region;
  return l;
}

absl::Status SampleTokens(const SampleParams& params, cudaStream_t stream) {
  SampleParams p = params;
  if (p.dtype != ActDtype::kFp32 && p.dtype != ActDtype::kFp16 && p.dtype != ActDtype::kBf16) {
    return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  }
  if (p.vocab < 1 || p.vocab > kMaxSampleVocab) return Bad("vocab", "in [1, 2^20]", p.vocab);
  if (p.num_rows < 0) return Bad("num_rows", ">= 0", p.num_rows);
  if (p.logits_stride == 0) p.logits_stride = p.vocab;
  if (p.logits_stride < p.vocab) return Bad("logits_stride", ">= vocab", p.logits_stride);
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.logits == nullptr) return absl::InvalidArgumentError("SampleTokens: logits is null");
  if (p.rows == nullptr) return absl::InvalidArgumentError("SampleTokens: rows is null");
  if (p.processed == nullptr) return absl::InvalidArgumentError("SampleTokens: processed is null");
  if (p.counts == nullptr) return absl::InvalidArgumentError("SampleTokens: counts is null");
  if (p.results == nullptr) return absl::InvalidArgumentError("SampleTokens: results is null");
  LaunchKernel(sample_detail::SampleKernel, static_cast<unsigned>(p.num_rows),
               sample_detail::kThreads, 0, stream, p);
  return CudaStatus(cudaGetLastError(), "SampleTokens launch");
}

}  // namespace kvserve::cuda
