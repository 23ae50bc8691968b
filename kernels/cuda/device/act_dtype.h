// ActDtype: the storage type of activations, weights and logits on the GPU
// (model.dtype). Every kernel of kernels/cuda/ that reads or writes
// activations takes one; arithmetic is fp32 whatever the storage type.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>

namespace kvserve::cuda {

enum class ActDtype : uint8_t { kFp32, kFp16, kBf16 };

inline constexpr int64_t ActDtypeSize(ActDtype dtype) { return dtype == ActDtype::kFp32 ? 4 : 2; }

}  // namespace kvserve::cuda
