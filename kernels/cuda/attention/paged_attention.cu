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

#include "absl/strings/str_cat.h"
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

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("PagedAttention: ", field, " must be ", rule, ", got ", value));
}

absl::Status Null(const char* field) {
  return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", field, " is null"));
}

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

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
        return Bad(name, "an int4 part with an even group_size dividing head_dim", part.group_size);
      }
      row = head_dim / 2;
      meta = 4 * (head_dim / part.group_size);
      break;
    default:
      return Bad(name, "a known element type", static_cast<int64_t>(part.elem));
  }
  if (part.row_bytes != row)
    return Bad(name, "row_bytes matching its element type", part.row_bytes);
  if (part.meta_bytes != meta) {
    return Bad(name, "meta_bytes matching its element type", part.meta_bytes);
  }
  if (part.data_offset % 16 != 0 || part.meta_offset % 16 != 0) {
    return Bad(name, "16-byte aligned offsets", part.data_offset);
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
  if (layout.num_kv_heads <= 0) return Bad("kv.layout.num_kv_heads", "> 0", layout.num_kv_heads);
  if (hd <= 0 || hd % 2 != 0 || hd > kGpuAttentionMaxHeadDim) {
    return Bad("kv.layout.head_dim", "even and in [2, 256]", hd);
  }
  if (layout.block_size <= 0) return Bad("kv.layout.block_size", "> 0", layout.block_size);
  KV_RETURN_IF_ERROR(CheckPart("kv.layout.k", layout.k, hd));
  KV_RETURN_IF_ERROR(CheckPart("kv.layout.v", layout.v, hd));
  const KernelFn kernel = KernelFor(layout.k.elem, layout.v.elem);
  if (kernel == nullptr) {
    return Bad("kv.layout (k, v) elements", "one KvFormat's pair",
               static_cast<int64_t>(layout.k.elem) * 16 + static_cast<int64_t>(layout.v.elem));
  }
  if (p.num_heads <= 0 || p.num_heads % layout.num_kv_heads != 0) {
    return Bad("num_heads", "a positive multiple of num_kv_heads", p.num_heads);
  }
  if (!std::isfinite(p.scale))
    return absl::InvalidArgumentError("PagedAttention: scale must be finite");
  if (p.sliding_window < 0) return Bad("sliding_window", ">= 0", p.sliding_window);
  if (p.dtype != ActDtype::kFp32 && p.dtype != ActDtype::kFp16 && p.dtype != ActDtype::kBf16) {
    return Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  }
  const int64_t row_elems = int64_t(p.num_heads) * hd;
  const int64_t q_stride = p.q_stride == 0 ? row_elems : p.q_stride;
  const int64_t out_stride = p.out_stride == 0 ? row_elems : p.out_stride;
  if (q_stride < row_elems) return Bad("q_stride", ">= num_heads * head_dim", q_stride);
  if (out_stride < row_elems) return Bad("out_stride", ">= num_heads * head_dim", out_stride);

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
  if (p.kv.pages == nullptr) return Null("kv.pages");
  if (p.plan == nullptr) return Null("plan");
  if (!Aligned(p.plan, 4))
    return absl::InvalidArgumentError("PagedAttention: plan must be 4-byte aligned");
  if (p.batch.query_start == nullptr) return Null("batch.query_start");
  if (p.batch.context_len == nullptr) return Null("batch.context_len");
  if (p.batch.block_table == nullptr) return Null("batch.block_table");
  if (p.batch.max_blocks_per_seq <= 0) {
    return Bad("batch.max_blocks_per_seq", "> 0", p.batch.max_blocks_per_seq);
  }
  const GpuAttentionShape shape = ShapeOf(p);
  const int64_t need = GpuAttentionWorkspaceBytes(shape, launch.num_partials);
  if (need > 0) {
    if (p.workspace == nullptr) return Null("workspace");
    if (!Aligned(p.workspace, 8)) {
      return absl::InvalidArgumentError("PagedAttention: workspace must be 8-byte aligned");
    }
    if (p.workspace_bytes < need) {
      return Bad("workspace_bytes", "GpuAttentionWorkspaceBytes(shape, launch.num_partials)",
                 p.workspace_bytes);
    }
  }
  if ((p.sink_q == nullptr) != (p.num_sinks == nullptr)) {
    return absl::InvalidArgumentError("PagedAttention: sink_q and num_sinks go together");
  }
  const bool mass = p.key_mass != nullptr;
  if (mass != (p.key_mass_offset != nullptr) || mass != (p.softmax_stats != nullptr)) {
    return absl::InvalidArgumentError(
        "PagedAttention: key_mass, key_mass_offset and softmax_stats go together");
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

  const int grid_y = p.num_heads / hpc;
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
    LaunchKernel(MergeKernel, static_cast<unsigned>(launch.num_merges), kThreads, 0, stream, args);
    KV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "PagedAttention merge launch"));
  }
  if (mass) {
    const KernelFn mass_kernel = attention_detail::MassKernelFor(layout.k.elem);
    if (mass_kernel == nullptr) return Bad("kv.layout.k.elem", "a per-token element type", 0);
    if (p.batch.num_tokens <= 0) return Bad("batch.num_tokens", "> 0 with key_mass", 0);
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
