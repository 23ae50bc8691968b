// Launcher of paged attention: validates the Params against the page layout
// and the plan, sizes shared memory from head_dim, and dispatches the K/V
// element pair of the format to the fast (tensor-core) kernel where it takes
// the layout (eighteen instantiations: six formats x head_dim 64, 128, 256),
// else to one of seven of the reference kernel (fp32, fp16, bf16, fp8_e4m3,
// int8, int4, k8v4; head_dim a runtime value there); the activation dtype
// is a runtime value in both.
// Then the merge kernel (one instantiation) when the plan split any row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "kernels/cuda/attention/attention_launch.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/attention/paged_attention_kernel.cuh"
#include "kernels/cuda/attention/paged_attention_mma_kernel.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"

namespace kvserve::cuda {
namespace {

using attention_detail::AttentionKernel;
using attention_detail::KernelArgs;
using attention_detail::kThreads;
using attention_detail::MergeKernel;

constexpr attention_launch::Errors kErr("PagedAttention");

// Row and meta sizes the layout must have for its element type.
absl::Status CheckPart(const char* name, const KvPartLayout& part, int head_dim) {
  int64_t row = 0, meta = 0;
  switch (part.elem) {
    case KvElem::kFp32:
      row = 4 * head_dim;
      break;
    case KvElem::kFp16:
    case KvElem::kBf16:
      row = 2 * head_dim;
      break;
    case KvElem::kFp8E4m3:
    case KvElem::kInt8:
      row = head_dim;
      meta = 4;
      break;
    case KvElem::kInt4:
      if (part.group_size <= 0 || part.group_size % 2 != 0 || head_dim % part.group_size != 0) {
        return kErr.Bad(name, "an int4 part with an even group_size dividing head_dim",
                        part.group_size);
      }
      row = head_dim / 2;
      meta = 4 * (head_dim / part.group_size);
      break;
    default:
      return kErr.Bad(name, "a known element type", static_cast<int64_t>(part.elem));
  }
  if (part.row_bytes != row)
    return kErr.Bad(name, "row_bytes matching its element type", part.row_bytes);
  if (part.meta_bytes != meta) {
    return kErr.Bad(name, "meta_bytes matching its element type", part.meta_bytes);
  }
  if (part.data_offset % 16 != 0 || part.meta_offset % 16 != 0) {
    return kErr.Bad(name, "16-byte aligned offsets", part.data_offset);
  }
  return absl::OkStatus();
}

using attention_detail::KernelFn;

KernelFn KernelFor(KvElem k, KvElem v) { return attention_detail::AttentionKernelFor(k, v); }

// The most dynamic shared memory a CTA may opt in to (sm_90: 227 KB).
constexpr int kMaxOptInSmem = 227 * 1024;

// Lets a kernel use `bytes` of dynamic shared memory (above the 48 KB
// default): the reference kernels the tile of the largest head_dim, the fast
// ones the opt-in maximum; done once per kernel, before any launch.
cudaError_t AllowLargeSmem(KernelFn kernel,
                           int bytes = attention_detail::SmemFloats(kGpuAttentionMaxHeadDim) *
                                       int{sizeof(float)}) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Whether the fast kernel runs: asked for, a layout it takes
// (MmaAttentionSupports: formats, head_dim, blocks, int4 groups) and its
// shared memory within the opt-in limit.
bool FastFits(const PagedAttentionParams& p) {
  return p.kernel == AttentionKernel::kFast &&
         attention_detail::MmaAttentionSupports(p.kv.layout) &&
         attention_detail::MmaSmemLayout(p.kv.layout, p.num_sinks != nullptr).total <=
             kMaxOptInSmem;
}

// The x extent of the attention grid: launch.num_items, or with num_sms the
// CTAs resident at once (by dynamic shared memory, at most 16 per SM) over
// the grid's y extent.
unsigned GridX(const PagedAttentionParams& p, size_t smem, int grid_y) {
  const int64_t items = p.launch.num_items;
  if (p.num_sms <= 0) return static_cast<unsigned>(items);
  constexpr int64_t kSmemPerSm = 228 * 1024;  // sm_90, of which 1 KB per CTA is reserved
  const int64_t per_sm =
      std::clamp<int64_t>(kSmemPerSm / (static_cast<int64_t>(smem) + 1024), 1, 16);
  const int64_t resident = std::max<int64_t>(1, int64_t(p.num_sms) * per_sm / grid_y);
  return static_cast<unsigned>(std::min(items, resident));
}

}  // namespace

bool UsesFastAttention(const PagedAttentionParams& params) { return FastFits(params); }

GpuAttentionShape ShapeOf(const PagedAttentionParams& p) {
  return {p.num_heads, p.kv.layout.num_kv_heads, p.kv.layout.head_dim, p.sliding_window};
}

absl::Status PagedAttention(const PagedAttentionParams& params, cudaStream_t stream) {
  const PagedAttentionParams& p = params;
  const KvPageLayout& layout = p.kv.layout;
  const int hd = layout.head_dim;
  if (layout.num_kv_heads <= 0) {
    return kErr.Bad("kv.layout.num_kv_heads", "> 0", layout.num_kv_heads);
  }
  if (hd <= 0 || hd % 2 != 0 || hd > kGpuAttentionMaxHeadDim) {
    return kErr.Bad("kv.layout.head_dim", "even and in [2, 256]", hd);
  }
  if (layout.block_size <= 0) return kErr.Bad("kv.layout.block_size", "> 0", layout.block_size);
  KV_RETURN_IF_ERROR(CheckPart("kv.layout.k", layout.k, hd));
  KV_RETURN_IF_ERROR(CheckPart("kv.layout.v", layout.v, hd));
  const KernelFn kernel = KernelFor(layout.k.elem, layout.v.elem);
  if (kernel == nullptr) {
    return kErr.Bad("kv.layout (k, v) elements", "one KvFormat's pair",
                    static_cast<int64_t>(layout.k.elem) * 16 + static_cast<int64_t>(layout.v.elem));
  }
  attention_launch::Checked checked;
  KV_RETURN_IF_ERROR(attention_launch::CheckHeadsAndStrides(kErr, p, checked));
  KV_RETURN_IF_ERROR(attention_launch::CheckPlan(kErr, p, nullptr, checked));
  if (checked.empty) return absl::OkStatus();
  if ((p.sink_q == nullptr) != (p.num_sinks == nullptr)) {
    return kErr.Invalid("sink_q and num_sinks go together");
  }
  const bool mass = p.key_mass != nullptr;
  if (mass != (p.key_mass_offset != nullptr) || mass != (p.softmax_stats != nullptr)) {
    return kErr.Invalid("key_mass, key_mass_offset and softmax_stats go together");
  }
  const GpuAttentionLaunch& launch = p.launch;
  KV_RETURN_IF_ERROR(attention_launch::CheckMerges(kErr, launch));

  KernelArgs args;
  attention_launch::FillArgs(p, checked, args);
  args.sink_q = p.sink_q;
  args.num_sinks = p.num_sinks;
  args.softmax_stats = p.softmax_stats;
  args.key_mass = p.key_mass;
  args.key_mass_offset = p.key_mass_offset;

  static const cudaError_t smem_status = [] {
    for (KvElem e : {KvElem::kFp32, KvElem::kFp16, KvElem::kBf16, KvElem::kFp8E4m3, KvElem::kInt8,
                     KvElem::kInt4}) {
      if (const cudaError_t err = AllowLargeSmem(KernelFor(e, e)); err != cudaSuccess) return err;
    }
    return AllowLargeSmem(KernelFor(KvElem::kInt8, KvElem::kInt4));
  }();
  KV_CUDA_RETURN_IF_ERROR(smem_status);

  const int grid_y = p.num_heads / checked.heads_per_cta;
  if (FastFits(p)) {
    static const cudaError_t fast_smem_status = [] {
      const std::pair<KvElem, KvElem> pairs[] = {
          {KvElem::kFp16, KvElem::kFp16},       {KvElem::kBf16, KvElem::kBf16},
          {KvElem::kFp8E4m3, KvElem::kFp8E4m3}, {KvElem::kInt8, KvElem::kInt8},
          {KvElem::kInt4, KvElem::kInt4},       {KvElem::kInt8, KvElem::kInt4}};
      for (const auto& [k, v] : pairs) {
        for (int head_dim : {64, 128, 256}) {
          const cudaError_t err = AllowLargeSmem(
              attention_detail::MmaAttentionKernelFor(k, v, head_dim), kMaxOptInSmem);
          if (err != cudaSuccess) return err;
        }
      }
      return cudaSuccess;
    }();
    KV_CUDA_RETURN_IF_ERROR(fast_smem_status);
    const KernelFn fast = attention_detail::MmaAttentionKernelFor(layout.k.elem, layout.v.elem, hd);
    const auto smem =
        static_cast<size_t>(attention_detail::MmaSmemLayout(layout, p.num_sinks != nullptr).total);
    LaunchKernel(fast, dim3(GridX(p, smem, grid_y), grid_y), kThreads, smem, stream, args);
  } else {
    const size_t smem = static_cast<size_t>(attention_detail::SmemFloats(hd)) * sizeof(float);
    LaunchKernel(kernel, dim3(GridX(p, smem, grid_y), grid_y), kThreads, smem, stream, args);
  }
  KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttention attention launch"));
  if (launch.num_merges > 0) {
    LaunchKernel(MergeKernel, attention_skeleton::MergeGrid(launch.num_merges, p.num_heads),
                 kThreads, 0, stream, args);
    KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttention merge launch"));
  }
  if (mass) {
    const KernelFn mass_kernel = attention_detail::MassKernelFor(layout.k.elem);
    if (mass_kernel == nullptr) return kErr.Bad("kv.layout.k.elem", "a per-token element type", 0);
    if (p.batch.num_tokens <= 0) return kErr.Bad("batch.num_tokens", "> 0 with key_mass", 0);
    LaunchKernel(mass_kernel, static_cast<unsigned>(p.batch.num_tokens), kThreads, 0, stream, args);
    KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttention mass launch"));
  }
  return absl::OkStatus();
}

absl::Status GatherAttentionMass(const GatherMassParams& p, cudaStream_t stream) {
  if (p.batch.num_seqs <= 0) return absl::OkStatus();
  if (p.key_mass == nullptr || p.key_mass_offset == nullptr || p.stats_offset == nullptr ||
      p.out == nullptr || p.batch.query_start == nullptr || p.batch.context_len == nullptr) {
    return absl::InvalidArgumentError("GatherAttentionMass: a pointer is null");
  }
  attention_detail::GatherArgs g{p.batch,           p.sliding_window, p.key_mass,
                                 p.key_mass_offset, p.stats_offset,   p.out};
  LaunchKernel(attention_detail::GatherMassKernel, static_cast<unsigned>(p.batch.num_seqs),
               kThreads, 0, stream, g);
  return CudaStatus(cudaGetLastError(), "GatherAttentionMass launch");
}

}  // namespace kvserve::cuda
