// Launcher of int4_kc / int2_kc paged attention: validates the int4_kc
// layout, then the fields it shares with PagedAttention (attention_launch.h,
// the same checks in the same order) and the step's K/V; then the attention
// kernel and, when the plan split rows, the merge kernel (one instantiation
// each).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/paged_attention_kc.h"
#include "kernels/cuda/attention/paged_attention_kc_kernel.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"

namespace kvserve::cuda {
namespace {

using attention_kc_detail::AttentionKcKernel;
using attention_kc_detail::KernelArgs;
using attention_kc_detail::kThreads;
using attention_kc_detail::MergeKcKernel;

constexpr attention_launch::Errors kErr("PagedAttentionKc");

}  // namespace

absl::Status PagedAttentionKc(const PagedAttentionKcParams& params, cudaStream_t stream) {
  const PagedAttentionParams& p = params.attn;
  const KvPageLayout& layout = p.kv.layout;
  const int hd = layout.head_dim;
  if (layout.num_kv_heads <= 0)
    return kErr.Bad("kv.layout.num_kv_heads", "> 0", layout.num_kv_heads);
  if (hd <= 0 || hd % 2 != 0 || hd > kGpuAttentionMaxHeadDim) {
    return kErr.Bad("kv.layout.head_dim", "even and in [2, 256]", hd);
  }
  if (layout.block_size < kGpuAttentionMaxQueryVectors) {
    // An item's rows (at most 16) must span at most two blocks.
    return kErr.Bad("kv.layout.block_size", ">= 16 for int4_kc", layout.block_size);
  }
  if (layout.k.elem != KvElem::kInt4Channel || layout.v.elem != KvElem::kInt4 ||
      !layout.has_tails() || layout.tail.elem != KvElem::kFp16) {
    return kErr.Bad("kv.layout", "int4_kc or int2_kc with fp16 tails (k, v, tail elements)",
                    static_cast<int64_t>(layout.k.elem) * 256 +
                        static_cast<int64_t>(layout.v.elem) * 16 +
                        static_cast<int64_t>(layout.tail.elem));
  }
  if ((layout.k.bits != 4 && layout.k.bits != 2) || layout.v.bits != layout.k.bits) {
    return kErr.Bad("kv.layout.k.bits", "4 or 2, as v.bits", layout.k.bits);
  }
  const int per = 8 / layout.k.bits;
  if (hd % per != 0) return kErr.Bad("kv.layout.head_dim", "a multiple of 8 / bits", hd);
  if (layout.v.group_size <= 0 || layout.v.group_size % per != 0 || hd % layout.v.group_size != 0) {
    return kErr.Bad("kv.layout.v.group_size", "a multiple of 8 / bits dividing head_dim",
                    layout.v.group_size);
  }
  if (layout.k.meta_offset % 4 != 0 || layout.v.meta_offset % 4 != 0 ||
      layout.tail.k_offset % 4 != 0 || layout.tail.v_offset % 4 != 0) {
    return kErr.Bad("kv.layout offsets", "4-byte aligned", layout.k.meta_offset);
  }
  attention_launch::Checked checked;
  KV_RETURN_IF_ERROR(attention_launch::CheckHeadsAndStrides(kErr, p, checked));
  const int64_t kv_elems = int64_t(layout.num_kv_heads) * hd;
  const int64_t k_stride = params.new_k_stride == 0 ? kv_elems : params.new_k_stride;
  const int64_t v_stride = params.new_v_stride == 0 ? kv_elems : params.new_v_stride;
  if (k_stride < kv_elems) return kErr.Bad("new_k_stride", ">= num_kv_heads * head_dim", k_stride);
  if (v_stride < kv_elems) return kErr.Bad("new_v_stride", ">= num_kv_heads * head_dim", v_stride);
  KV_RETURN_IF_ERROR(attention_launch::CheckPlan(kErr, p, &params, checked));
  if (checked.empty) return absl::OkStatus();
  const GpuAttentionLaunch& launch = p.launch;
  KV_RETURN_IF_ERROR(attention_launch::CheckMerges(kErr, launch));

  KernelArgs args;
  attention_launch::FillArgs(p, checked, args);
  args.new_k = params.new_k;
  args.new_v = params.new_v;
  args.new_k_stride = k_stride;
  args.new_v_stride = v_stride;

  static const cudaError_t smem_status = cudaFuncSetAttribute(
      AttentionKcKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      attention_kc_detail::SmemFloats(kGpuAttentionMaxHeadDim) * static_cast<int>(sizeof(float)));
  KV_CUDA_RETURN_IF_ERROR(smem_status);

  const size_t smem = static_cast<size_t>(attention_kc_detail::SmemFloats(hd)) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(launch.num_items),
                  static_cast<unsigned>(p.num_heads / checked.heads_per_cta));
  LaunchKernel(AttentionKcKernel, grid, kThreads, smem, stream, args);
  KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttentionKc attention launch"));
  if (launch.num_merges > 0) {
    LaunchKernel(MergeKcKernel, attention_skeleton::MergeGrid(launch.num_merges, p.num_heads),
                 kThreads, 0, stream, args);
    KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttentionKc merge launch"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::cuda
