// Launcher of RoPE: validates the Params and dispatches the activation dtype
// (three instantiations; the style is a runtime branch, uniform per launch).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/rope.h"
#include "kernels/cuda/layers/rope_kernel.cuh"

namespace kvserve::cuda {
namespace {

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("ApplyRope: ", field, " must be ", rule, ", got ", value));
}

}  // namespace

absl::Status ApplyRope(const RopeParams& params, cudaStream_t stream) {
  RopeParams p = params;
  if (p.head_dim <= 0 || p.head_dim % 2 != 0)
    return Bad("head_dim", "positive and even", p.head_dim);
  if (p.num_q_heads < 0) return Bad("num_q_heads", ">= 0", p.num_q_heads);
  if (p.num_kv_heads < 0) return Bad("num_kv_heads", ">= 0", p.num_kv_heads);
  if (p.q_stride == 0) p.q_stride = static_cast<int64_t>(p.num_q_heads) * p.head_dim;
  if (p.k_stride == 0) p.k_stride = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  if (p.q != nullptr && p.q_stride < static_cast<int64_t>(p.num_q_heads) * p.head_dim) {
    return Bad("q_stride", ">= num_q_heads * head_dim", p.q_stride);
  }
  if (p.k != nullptr && p.k_stride < static_cast<int64_t>(p.num_kv_heads) * p.head_dim) {
    return Bad("k_stride", ">= num_kv_heads * head_dim", p.k_stride);
  }
  if (p.max_positions <= 0) return Bad("max_positions", "> 0", p.max_positions);
  if (p.num_tokens < 0) return Bad("num_tokens", ">= 0", p.num_tokens);
  if (p.style != RopeStyle::kInterleaved && p.style != RopeStyle::kNeox) {
    return Bad("style", "kInterleaved or kNeox", static_cast<int64_t>(p.style));
  }
  if (p.num_tokens == 0 || (p.q == nullptr && p.k == nullptr)) return absl::OkStatus();
  if (p.positions == nullptr) return absl::InvalidArgumentError("ApplyRope: positions is null");
  if ((p.row_cos == nullptr) != (p.row_sin == nullptr)) {
    return absl::InvalidArgumentError("ApplyRope: row_cos and row_sin go together");
  }
  if (p.cos == nullptr || p.sin == nullptr) {
    return absl::InvalidArgumentError("ApplyRope: cos or sin table is null");
  }
  const bool known = DispatchActDtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(rope_detail::RopeKernel<T>, static_cast<unsigned>(p.num_tokens),
                 rope_detail::kThreads, 0, stream, p);
  });
  if (!known) return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  return CudaStatus(cudaGetLastError(), "ApplyRope launch");
}

}  // namespace kvserve::cuda
