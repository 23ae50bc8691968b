// Launcher of the embedding lookup: validates the Params, decides whether
// 16-byte copies are safe and launches the one instantiation.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/embedding.h"
#include "kernels/cuda/layers/embedding_kernel.cuh"

namespace kvserve::cuda {
namespace {

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("Embedding: ", field, " must be ", rule, ", got ", value));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status Embedding(const EmbeddingParams& params, cudaStream_t stream) {
  EmbeddingParams p = params;
  if (p.dtype != ActDtype::kFp32 && p.dtype != ActDtype::kFp16 && p.dtype != ActDtype::kBf16) {
    return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  }
  if (p.vocab <= 0) return Bad("vocab", "> 0", p.vocab);
  if (p.dim <= 0) return Bad("dim", "> 0", p.dim);
  if (p.num_tokens < 0 || p.num_tokens > 0x7fffffff) {
    return Bad("num_tokens", "in [0, 2^31)", p.num_tokens);
  }
  if (p.out_stride == 0) p.out_stride = p.dim;
  if (p.out_stride < p.dim) return Bad("out_stride", ">= dim", p.out_stride);
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.table == nullptr) return absl::InvalidArgumentError("Embedding: table is null");
  if (p.ids == nullptr) return absl::InvalidArgumentError("Embedding: ids is null");
  if (p.out == nullptr) return absl::InvalidArgumentError("Embedding: out is null");
  const int64_t elem = ActDtypeSize(p.dtype);
  const bool vectorized = (p.dim * elem) % 16 == 0 && (p.out_stride * elem) % 16 == 0 &&
                          Aligned16(p.table) && Aligned16(p.out);
  LaunchKernel(embedding_detail::EmbeddingKernel, static_cast<unsigned>(p.num_tokens),
               embedding_detail::kThreads, 0, stream, p, elem, vectorized);
  return CudaStatus(cudaGetLastError(), "Embedding launch");
}

}  // namespace kvserve::cuda
