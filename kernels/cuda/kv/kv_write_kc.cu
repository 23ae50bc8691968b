// Launchers of the int4_kc / int2_kc writes: validate the layout (int4_kc or
// int2_kc with fp16 tails, since the kernels trust it for every store; the
// code bits are a runtime value of the layout), then dispatch the
// activation dtype to one of three instantiations per kernel.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/kv/kv_write_kc.h"
#include "kernels/cuda/kv/kv_write_kc_kernel.cuh"

namespace kvserve::cuda {
namespace {

using kv_kc_detail::kThreads;
using kv_kc_detail::kWarps;

absl::Status Bad(const char* fn, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(fn, ": ", what));
}

// Fills default strides; checks what both kernels rely on.
absl::Status Check(const char* fn, KvKcWriteParams& p) {
  const KvPageLayout& l = p.kv.layout;
  if (l.head_dim <= 0 || l.head_dim % 2 != 0 || l.head_dim > kv_kc_detail::kMaxHeadDim) {
    return Bad(fn, absl::StrCat("kv.layout.head_dim must be even and in [2, ",
                                kv_kc_detail::kMaxHeadDim, "], got ", l.head_dim));
  }
  if (l.num_kv_heads <= 0) {
    return Bad(fn, absl::StrCat("kv.layout.num_kv_heads must be > 0, got ", l.num_kv_heads));
  }
  if (l.block_size <= 0) {
    return Bad(fn, absl::StrCat("kv.layout.block_size must be > 0, got ", l.block_size));
  }
  if (l.k.elem != KvElem::kInt4Channel || l.v.elem != KvElem::kInt4 || !l.has_tails() ||
      l.tail.elem != KvElem::kFp16) {
    return Bad(fn,
               "kv.layout must be int4_kc or int2_kc with fp16 tails (KvFormat::Create(kInt4Kc "
               "or kInt2Kc, ..., KvElem::kFp16))");
  }
  const int bits = l.k.bits, per = 8 / (bits > 0 ? bits : 1);
  if ((bits != 4 && bits != 2) || l.v.bits != bits || l.head_dim % per != 0) {
    return Bad(fn, absl::StrCat("kv.layout code bits must be 4 or 2 in K and V (head_dim a "
                                "multiple of 8 / bits), got ",
                                l.k.bits, " and ", l.v.bits));
  }
  if (l.k.row_bytes != l.head_dim / per || l.k.meta_bytes != kInt4ChannelHeader + 2 * l.head_dim ||
      l.v.row_bytes != l.head_dim / per || l.v.group_size <= 0 || l.v.group_size % per != 0 ||
      l.head_dim % l.v.group_size != 0 || l.v.meta_bytes != 4 * (l.head_dim / l.v.group_size) ||
      l.tail.row_bytes != 2 * l.head_dim) {
    return Bad(fn, "kv.layout row/meta bytes do not match int4_kc / int2_kc");
  }
  const int64_t row_elems = static_cast<int64_t>(l.num_kv_heads) * l.head_dim;
  if (p.k_stride == 0) p.k_stride = row_elems;
  if (p.v_stride == 0) p.v_stride = row_elems;
  if (p.k_stride < row_elems) {
    return Bad(fn, absl::StrCat("k_stride must be >= num_kv_heads * head_dim = ", row_elems,
                                ", got ", p.k_stride));
  }
  if (p.v_stride < row_elems) {
    return Bad(fn, absl::StrCat("v_stride must be >= num_kv_heads * head_dim = ", row_elems,
                                ", got ", p.v_stride));
  }
  if (p.batch.num_seqs < 0 || p.batch.num_tokens < 0) {
    return Bad(fn, "batch.num_seqs and batch.num_tokens must be >= 0");
  }
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return absl::OkStatus();
  if (p.k == nullptr) return Bad(fn, "k is null");
  if (p.v == nullptr) return Bad(fn, "v is null");
  if (p.batch.query_start == nullptr) return Bad(fn, "batch.query_start is null");
  if (p.batch.context_len == nullptr) return Bad(fn, "batch.context_len is null");
  if (p.batch.block_table == nullptr) return Bad(fn, "batch.block_table is null");
  if (p.batch.tail_ids == nullptr) return Bad(fn, "batch.tail_ids is null");
  if (p.kv.pages == nullptr) return Bad(fn, "kv.pages is null");
  if (p.kv.tails == nullptr) return Bad(fn, "kv.tails is null");
  return absl::OkStatus();
}

}  // namespace

absl::Status SealKvBlocks(const KvKcWriteParams& params, cudaStream_t stream) {
  KvKcWriteParams p = params;
  KV_RETURN_IF_ERROR(Check("SealKvBlocks", p));
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(p.batch.num_seqs),
                  static_cast<unsigned>(p.kv.layout.num_kv_heads));
  const bool known = DispatchActDtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(kv_kc_detail::SealKernel<T>, grid, kThreads, 0, stream, p);
  });
  if (!known)
    return Bad("SealKvBlocks",
               absl::StrCat("dtype ", static_cast<int>(p.dtype), " is not an ActDtype"));
  return CudaStatus(cudaGetLastError(), "SealKvBlocks launch");
}

absl::Status WriteKvTails(const KvKcWriteParams& params, cudaStream_t stream) {
  KvKcWriteParams p = params;
  KV_RETURN_IF_ERROR(Check("WriteKvTails", p));
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return absl::OkStatus();
  const int64_t items = static_cast<int64_t>(p.batch.num_tokens) * p.kv.layout.num_kv_heads * 2;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return Bad("WriteKvTails", "num_tokens * num_kv_heads is too large");
  const bool known = DispatchActDtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(kv_kc_detail::TailKernel<T>, static_cast<unsigned>(blocks), kThreads, 0, stream,
                 p);
  });
  if (!known)
    return Bad("WriteKvTails",
               absl::StrCat("dtype ", static_cast<int>(p.dtype), " is not an ActDtype"));
  return CudaStatus(cudaGetLastError(), "WriteKvTails launch");
}

}  // namespace kvserve::cuda
