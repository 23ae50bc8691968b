// Load-time check that weights are finite: a checkpoint with a NaN or an
// infinity loads and serves garbage (" ⁇  ⁇ ..." with status 200), so the
// loaders refuse it, naming the tensor and the first bad element.
//
// The scan reads each value's exponent bits in blocks with a branch-free OR,
// which the compiler vectorizes (about memory bandwidth; see
// tests/model/loader/weight_check_test.cc), and only locates the element once a
// block holds one.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace kvserve {

// The index of the first NaN or infinity in x[0..n), or -1.
int64_t FirstNonFinite(const float* x, int64_t n);

// OK, or DataLoss "<path>: tensor '<name>' holds NaN at element i (of n); the
// checkpoint is corrupt".
absl::Status CheckFinite(const float* x, int64_t n, std::string_view tensor, std::string_view path);

}  // namespace kvserve
