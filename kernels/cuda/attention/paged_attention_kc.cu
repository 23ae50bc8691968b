// Launcher of int4_kc / int2_kc paged attention: validates as PagedAttention does
// (paged_attention.cu) for the shared fields, plus the int4_kc layout, the
// tails and the step's K/V; then the attention kernel and, when the plan
// split rows, the merge kernel (one instantiation each).
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
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

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("PagedAttentionKc: ", field, " must be ", rule, ", got ", value));
}

absl::Status Null(const char* field) {
  return absl::InvalidArgumentError(absl::StrCat("PagedAttentionKc: ", field, " is null"));
}

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

absl::Status PagedAttentionKc(const PagedAttentionKcParams& params, cudaStream_t stream) {
  const PagedAttentionParams& p = params.attn;
  const KvPageLayout& layout = p.kv.layout;
  const int hd = layout.head_dim;
  if (layout.num_kv_heads <= 0) return Bad("kv.layout.num_kv_heads", "> 0", layout.num_kv_heads);
  if (hd <= 0 || hd % 2 != 0 || hd > kGpuAttentionMaxHeadDim) {
    return Bad("kv.layout.head_dim", "even and in [2, 256]", hd);
  }
  if (layout.block_size < kGpuAttentionMaxQueryVectors) {
    // An item's rows (at most 16) must span at most two blocks.
    return Bad("kv.layout.block_size", ">= 16 for int4_kc", layout.block_size);
  }
  if (layout.k.elem != KvElem::kInt4Channel || layout.v.elem != KvElem::kInt4 ||
      !layout.has_tails() || layout.tail.elem != KvElem::kFp16) {
    return Bad("kv.layout", "int4_kc or int2_kc with fp16 tails (k, v, tail elements)",
               static_cast<int64_t>(layout.k.elem) * 256 +
                   static_cast<int64_t>(layout.v.elem) * 16 +
                   static_cast<int64_t>(layout.tail.elem));
  }
  if ((layout.k.bits != 4 && layout.k.bits != 2) || layout.v.bits != layout.k.bits) {
    return Bad("kv.layout.k.bits", "4 or 2, as v.bits", layout.k.bits);
  }
  const int per = 8 / layout.k.bits;
  if (hd % per != 0) return Bad("kv.layout.head_dim", "a multiple of 8 / bits", hd);
  if (layout.v.group_size <= 0 || layout.v.group_size % per != 0 || hd % layout.v.group_size != 0) {
    return Bad("kv.layout.v.group_size", "a multiple of 8 / bits dividing head_dim",
               layout.v.group_size);
  }
  if (layout.k.meta_offset % 4 != 0 || layout.v.meta_offset % 4 != 0 ||
      layout.tail.k_offset % 4 != 0 || layout.tail.v_offset % 4 != 0) {
    return Bad("kv.layout offsets", "4-byte aligned", layout.k.meta_offset);
  }
  if (p.num_heads <= 0 || p.num_heads % layout.num_kv_heads != 0) {
    return Bad("num_heads", "a positive multiple of num_kv_heads", p.num_heads);
  }
  if (!std::isfinite(p.scale))
    return absl::InvalidArgumentError("PagedAttentionKc: scale must be finite");
  if (p.sliding_window < 0) return Bad("sliding_window", ">= 0", p.sliding_window);
  if (p.dtype != ActDtype::kFp32 && p.dtype != ActDtype::kFp16 && p.dtype != ActDtype::kBf16) {
    return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  }
  const int64_t row_elems = int64_t(p.num_heads) * hd;
  const int64_t kv_elems = int64_t(layout.num_kv_heads) * hd;
  const int64_t q_stride = p.q_stride == 0 ? row_elems : p.q_stride;
  const int64_t out_stride = p.out_stride == 0 ? row_elems : p.out_stride;
  const int64_t k_stride = params.new_k_stride == 0 ? kv_elems : params.new_k_stride;
  const int64_t v_stride = params.new_v_stride == 0 ? kv_elems : params.new_v_stride;
  if (q_stride < row_elems) return Bad("q_stride", ">= num_heads * head_dim", q_stride);
  if (out_stride < row_elems) return Bad("out_stride", ">= num_heads * head_dim", out_stride);
  if (k_stride < kv_elems) return Bad("new_k_stride", ">= num_kv_heads * head_dim", k_stride);
  if (v_stride < kv_elems) return Bad("new_v_stride", ">= num_kv_heads * head_dim", v_stride);

  const GpuAttentionLaunch& launch = p.launch;
  const int32_t hpc = GpuAttentionHeadsPerCta(p.num_heads, layout.num_kv_heads);
  if (launch.num_items < 0) return Bad("launch.num_items", ">= 0", launch.num_items);
  if (launch.num_merges < 0) return Bad("launch.num_merges", ">= 0", launch.num_merges);
  if (launch.num_partials < 0) return Bad("launch.num_partials", ">= 0", launch.num_partials);
  if (launch.num_items == 0) {
    return launch.num_merges == 0 ? absl::OkStatus()
                                  : Bad("launch.num_merges", "0 without items", launch.num_merges);
  }
  if (launch.heads_per_cta != hpc) {
    return Bad("launch.heads_per_cta", "GpuAttentionHeadsPerCta(num_heads, num_kv_heads)",
               launch.heads_per_cta);
  }
  if (p.q == nullptr) return Null("q");
  if (p.out == nullptr) return Null("out");
  if (params.new_k == nullptr) return Null("new_k");
  if (params.new_v == nullptr) return Null("new_v");
  if (p.kv.pages == nullptr) return Null("kv.pages");
  if (p.kv.tails == nullptr) return Null("kv.tails");
  if (p.plan == nullptr) return Null("plan");
  if (!Aligned(p.plan, 4))
    return absl::InvalidArgumentError("PagedAttentionKc: plan must be 4-byte aligned");
  if (p.batch.query_start == nullptr) return Null("batch.query_start");
  if (p.batch.context_len == nullptr) return Null("batch.context_len");
  if (p.batch.block_table == nullptr) return Null("batch.block_table");
  if (p.batch.tail_ids == nullptr) return Null("batch.tail_ids");
  if (p.batch.max_blocks_per_seq <= 0) {
    return Bad("batch.max_blocks_per_seq", "> 0", p.batch.max_blocks_per_seq);
  }
  const GpuAttentionShape shape = ShapeOf(p);
  const int64_t need = GpuAttentionWorkspaceBytes(shape, launch.num_partials);
  if (need > 0) {
    if (p.workspace == nullptr) return Null("workspace");
    if (!Aligned(p.workspace, 8)) {
      return absl::InvalidArgumentError("PagedAttentionKc: workspace must be 8-byte aligned");
    }
    if (p.workspace_bytes < need) {
      return Bad("workspace_bytes", "GpuAttentionWorkspaceBytes(shape, launch.num_partials)",
                 p.workspace_bytes);
    }
  }
  if (launch.num_merges > 0 && launch.num_partials == 0) {
    return Bad("launch.num_partials", "> 0 with merges", launch.num_partials);
  }

  KernelArgs args;
  args.q = p.q;
  args.out = p.out;
  args.q_stride = q_stride;
  args.out_stride = out_stride;
  args.dtype = p.dtype;
  args.kv = p.kv;
  args.batch = p.batch;
  args.num_heads = p.num_heads;
  args.group = p.num_heads / layout.num_kv_heads;
  args.heads_per_cta = hpc;
  args.scale = p.scale;
  args.sliding_window = p.sliding_window;
  args.plan = p.plan;
  args.workspace = static_cast<float*>(p.workspace);
  args.slot_floats = GpuAttentionSlotFloats(shape);
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
                  static_cast<unsigned>(p.num_heads / hpc));
  LaunchKernel(AttentionKcKernel, grid, kThreads, smem, stream, args);
  KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttentionKc attention launch"));
  if (launch.num_merges > 0) {
    LaunchKernel(MergeKcKernel, static_cast<unsigned>(launch.num_merges), kThreads, 0, stream,
                 args);
    KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttentionKc merge launch"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::cuda
