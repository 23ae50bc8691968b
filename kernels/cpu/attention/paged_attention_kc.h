// Internal to paged_attention.cc: attention over int4_kc pages (a layout
// with tails), the scalar reference and the AVX2 kernel (kv/kc_tails.h says
// where a key's full-precision row lives). Callers go through PagedAttention.
//
// Thread-safety: reentrant (scratch on the stack and in thread_local buffers).
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/kv/kc_tails.h"

namespace kvserve::cpu::internal {

// Whether the AVX2 kernel handles this int4_kc shape: head_dim a multiple
// of 8 and at most 512, V groups a multiple of 8.
bool Avx2KcAttentionSupports(const KvPageLayout& f);

void PagedAttentionKcScalar(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);
void PagedAttentionKcAvx2(const PagedAttentionParams& p, int32_t row_begin, int32_t row_end);

}  // namespace kvserve::cpu::internal
