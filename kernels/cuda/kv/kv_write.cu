// Launcher of the KV write: validates the Params (the page layout included,
// since the kernel trusts it for every store) and dispatches the activation
// dtype to one of three instantiations.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/kv/kv_write.h"
#include "kernels/cuda/kv/kv_write_kernel.cuh"

namespace kvserve::cuda {
namespace {

using kv_write_detail::kThreads;
using kv_write_detail::KvWriteKernel;
using kv_write_detail::kWarps;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("WriteKv: ", what));
}

// The part layout must be what KvFormat builds, since the kernel stores
// exactly row_bytes and meta_bytes per row at the offsets it names.
absl::Status CheckPart(const KvPageLayout& l, const KvPartLayout& part, const char* name) {
  int64_t row = 0, meta = 0;
  switch (part.elem) {
    case KvElem::kFp32:
      row = 4LL * l.head_dim;
      break;
    case KvElem::kFp16:
    case KvElem::kBf16:
      row = 2LL * l.head_dim;
      break;
    case KvElem::kFp8E4m3:
    case KvElem::kInt8:
      row = l.head_dim;
      meta = 4;
      break;
    case KvElem::kInt4:
      if (part.group_size <= 0 || part.group_size % 2 != 0 || l.head_dim % part.group_size != 0) {
        return Bad(absl::StrCat("kv.layout.", name, ".group_size ", part.group_size,
                                " must be even and divide head_dim ", l.head_dim));
      }
      row = l.head_dim / 2;
      meta = 4LL * (l.head_dim / part.group_size);
      break;
    default:
      return Bad(absl::StrCat("kv.layout.", name, ".elem ", static_cast<int>(part.elem),
                              " is not a known element type"));
  }
  if (part.row_bytes != row || part.meta_bytes != meta) {
    return Bad(absl::StrCat("kv.layout.", name, " row_bytes/meta_bytes ", part.row_bytes, "/",
                            part.meta_bytes, " do not match its element type (want ", row, "/",
                            meta, ")"));
  }
  const int64_t rows = static_cast<int64_t>(l.num_kv_heads) * l.block_size;
  if (part.data_offset < 0 || part.data_offset % 4 != 0 ||
      part.data_offset + rows * part.row_bytes > l.block_bytes || part.meta_offset < 0 ||
      part.meta_offset % 4 != 0 || part.meta_offset + rows * part.meta_bytes > l.block_bytes) {
    return Bad(absl::StrCat("kv.layout.", name, " offsets fall outside block_bytes ", l.block_bytes,
                            " or are not 4-byte aligned"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKv(const KvWriteParams& params, cudaStream_t stream) {
  KvWriteParams p = params;
  const KvPageLayout& l = p.kv.layout;
  if (l.head_dim <= 0 || l.head_dim % 2 != 0 || l.head_dim > kv_encode::kMaxHeadDim) {
    return Bad(absl::StrCat("kv.layout.head_dim must be even and in [2, ", kv_encode::kMaxHeadDim,
                            "], got ", l.head_dim));
  }
  if (l.num_kv_heads <= 0) {
    return Bad(absl::StrCat("kv.layout.num_kv_heads must be > 0, got ", l.num_kv_heads));
  }
  if (l.block_size <= 0) {
    return Bad(absl::StrCat("kv.layout.block_size must be > 0, got ", l.block_size));
  }
  if (l.block_bytes <= 0 || l.block_bytes % 16 != 0) {
    return Bad(absl::StrCat("kv.layout.block_bytes must be a positive multiple of 16, got ",
                            l.block_bytes));
  }
  if (l.k.elem == KvElem::kInt4Channel || l.v.elem == KvElem::kInt4Channel) {
    // int4_kc K is quantized per block once the block is full: its rows go
    // through fp16 tails (kv_write_kc.h: SealKvBlocks, WriteKvTails).
    return Bad("kv.layout is int4_kc: write it with SealKvBlocks and WriteKvTails (kv_write_kc.h)");
  }
  KV_RETURN_IF_ERROR(CheckPart(l, l.k, "k"));
  KV_RETURN_IF_ERROR(CheckPart(l, l.v, "v"));
  const int64_t row_elems = static_cast<int64_t>(l.num_kv_heads) * l.head_dim;
  if (p.k_stride == 0) p.k_stride = row_elems;
  if (p.v_stride == 0) p.v_stride = row_elems;
  if (p.k_stride < row_elems) {
    return Bad(absl::StrCat("k_stride must be >= num_kv_heads * head_dim = ", row_elems, ", got ",
                            p.k_stride));
  }
  if (p.v_stride < row_elems) {
    return Bad(absl::StrCat("v_stride must be >= num_kv_heads * head_dim = ", row_elems, ", got ",
                            p.v_stride));
  }
  if (p.num_tokens < 0) return Bad(absl::StrCat("num_tokens must be >= 0, got ", p.num_tokens));
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.k == nullptr) return Bad("k is null");
  if (p.v == nullptr) return Bad("v is null");
  if (p.slot_mapping == nullptr) return Bad("slot_mapping is null");
  if (p.kv.pages == nullptr) return Bad("kv.pages is null");
  if (p.kv.num_blocks <= 0)
    return Bad(absl::StrCat("kv.num_blocks must be > 0, got ", p.kv.num_blocks));

  const int64_t items = static_cast<int64_t>(p.num_tokens) * l.num_kv_heads * 2;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return Bad("num_tokens * num_kv_heads is too large for one launch");
  const bool known = DispatchActDtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(KvWriteKernel<T>, static_cast<unsigned>(blocks), kThreads, 0, stream, p);
  });
  if (!known) return Bad(absl::StrCat("dtype ", static_cast<int>(p.dtype), " is not an ActDtype"));
  return CudaStatus(cudaGetLastError(), "WriteKv launch");
}

}  // namespace kvserve::cuda
