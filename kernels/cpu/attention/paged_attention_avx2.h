// Internal to paged_attention.cc: the AVX2+FMA+F16C attention kernels.
// Callers go through PagedAttention, which picks this path when the CPU and
// the format allow it and otherwise runs the scalar reference.
//
// Thread-safety: reentrant (scratch lives on the stack and in thread_local
// buffers).
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "kernels/cpu/attention/paged_attention.h"

namespace kvserve::cpu::internal {

inline constexpr int kAvx2MaxHeadDim = 512;

// Whether the AVX2 kernels handle this shape: head_dim a multiple of 8 and
// at most kAvx2MaxHeadDim; int4 groups a multiple of 8.
bool Avx2AttentionSupports(const KvPageLayout& f);

// Same contract as PagedAttention; the caller has checked the CPU and the
// shape.
void PagedAttentionAvx2(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu::internal
