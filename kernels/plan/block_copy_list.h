// PackStepCopies: one step's block copies (cache/block_copy.h StepCopies)
// checked and laid out as one array for one upload to the device, where
// kernels/cuda/kv/copy_blocks.h runs each batch as one launch. Plain C++ so the
// packing and its checks are tested without a GPU.
//
// Layout: pairs = [swap_out][copies][swap_in], each BlockCopy two int32
// {src, dst} (asserted below: the device reads the vector's bytes as
// [n][2] int32). Batch b occupies pairs[b_begin, b_begin + num_b).
//
// Checks (InvalidArgument naming the batch and the pair): ids in range for
// their pool (swap_out: device -> host, copies: device -> device, swap_in:
// host -> device); within a batch no block is the destination twice, and in
// `copies` no destination is also a source. These are the invariants that
// let a backend run a batch's copies in parallel.
//
// Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_copy.h"

namespace kvserve {

static_assert(sizeof(BlockCopy) == 8 && offsetof(BlockCopy, src) == 0 &&
                  offsetof(BlockCopy, dst) == 4 && std::is_standard_layout_v<BlockCopy>,
              "device copy lists are the bytes of a BlockCopy array: {int32 src, int32 dst}");

struct PackedStepCopies {
  std::vector<BlockCopy> pairs;  // [swap_out][copies][swap_in]
  int32_t swap_out_begin = 0;
  int32_t num_swap_out = 0;
  int32_t copies_begin = 0;
  int32_t num_copies = 0;
  int32_t swap_in_begin = 0;
  int32_t num_swap_in = 0;
};

absl::StatusOr<PackedStepCopies> PackStepCopies(const StepCopies& step, int32_t num_device_blocks,
                                                int32_t num_host_blocks);

}  // namespace kvserve
