#include "kernels/plan/block_copy_list.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status CheckBatch(const std::vector<BlockCopy>& batch, const char* name, int32_t src_blocks,
                        int32_t dst_blocks, bool same_pool) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const BlockCopy& c = batch[i];
    if (c.src < 0 || c.src >= src_blocks || c.dst < 0 || c.dst >= dst_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "[", i, "] = {", c.src, ", ", c.dst, "} names a block outside ",
          "its pool (source blocks ", src_blocks, ", destination blocks ", dst_blocks, ")"));
    }
  }
  std::vector<BlockId> dsts(batch.size()), srcs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    dsts[i] = batch[i].dst;
    srcs[i] = batch[i].src;
  }
  std::sort(dsts.begin(), dsts.end());
  const auto dup = std::adjacent_find(dsts.begin(), dsts.end());
  if (dup != dsts.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": block ", *dup, " is the destination of two copies"));
  }
  if (same_pool) {
    std::sort(srcs.begin(), srcs.end());
    for (BlockId d : dsts) {
      if (std::binary_search(srcs.begin(), srcs.end(), d)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": block ", d, " is both a destination and a source"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PackedStepCopies> PackStepCopies(const StepCopies& step, int32_t num_device_blocks,
                                                int32_t num_host_blocks) {
  KV_RETURN_IF_ERROR(
      CheckBatch(step.swap_out, "swap_out", num_device_blocks, num_host_blocks, false));
  KV_RETURN_IF_ERROR(CheckBatch(step.copies, "copies", num_device_blocks, num_device_blocks, true));
  KV_RETURN_IF_ERROR(
      CheckBatch(step.swap_in, "swap_in", num_host_blocks, num_device_blocks, false));
  PackedStepCopies p;
  p.pairs.reserve(step.swap_out.size() + step.copies.size() + step.swap_in.size());
  p.swap_out_begin = 0;
  p.num_swap_out = static_cast<int32_t>(step.swap_out.size());
  p.pairs.insert(p.pairs.end(), step.swap_out.begin(), step.swap_out.end());
  p.copies_begin = static_cast<int32_t>(p.pairs.size());
  p.num_copies = static_cast<int32_t>(step.copies.size());
  p.pairs.insert(p.pairs.end(), step.copies.begin(), step.copies.end());
  p.swap_in_begin = static_cast<int32_t>(p.pairs.size());
  p.num_swap_in = static_cast<int32_t>(step.swap_in.size());
  p.pairs.insert(p.pairs.end(), step.swap_in.begin(), step.swap_in.end());
  return p;
}

}  // namespace kvserve
