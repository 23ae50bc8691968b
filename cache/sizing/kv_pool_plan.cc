#include "cache/sizing/kv_pool_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/sizing/block_count.h"

namespace kvserve {
namespace {

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
}

int32_t ClampBlocks(int64_t blocks) {
  return static_cast<int32_t>(std::clamp<int64_t>(blocks, 0, std::numeric_limits<int32_t>::max()));
}

}  // namespace

absl::StatusOr<KvPoolPlan> PlanKvPool(const KvPoolRequest& r) {
  if (r.bytes_per_block <= 0 || r.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot size the KV pool: blocks of ",
                                                   r.bytes_per_block, " bytes and ", r.block_size,
                                                   " tokens"));
  }
  if (r.num_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_blocks: must be >= 0, got ", r.num_blocks));
  }
  if (r.memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.memory_bytes: must be >= 0, got ", r.memory_bytes));
  }
  if (r.memory_fraction < 0 || r.memory_fraction > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.memory_fraction: must be in (0, 1], got ", r.memory_fraction));
  }
  const int64_t usable = std::max<int64_t>(0, r.available_bytes - r.reserve_bytes);
  const int64_t seq_blocks = BlocksForTokens(r.max_model_len, r.block_size);
  KvPoolPlan plan;
  const double fraction = r.memory_fraction > 0 ? r.memory_fraction : r.default_fraction;
  if (r.num_blocks > 0) {
    plan.sized_from = "cache.num_blocks";
    plan.num_blocks = r.num_blocks;
    plan.budget_bytes = r.num_blocks * r.bytes_per_block;
  } else if (r.memory_bytes > 0) {
    plan.sized_from = "cache.memory_bytes";
    plan.budget_bytes = r.memory_bytes;
    plan.num_blocks =
        ClampBlocks(std::max<int64_t>(0, r.memory_bytes - r.fixed_bytes) / r.bytes_per_block);
  } else if (fraction > 0) {
    plan.sized_from = r.memory_fraction > 0 ? "cache.memory_fraction" : "default";
    plan.budget_bytes = static_cast<int64_t>(std::floor(fraction * static_cast<double>(usable)));
    plan.num_blocks =
        ClampBlocks(std::max<int64_t>(0, plan.budget_bytes - r.fixed_bytes) / r.bytes_per_block);
  } else {
    plan.sized_from = "default";
    const int64_t wanted = int64_t{std::max(1, r.max_num_seqs)} * seq_blocks;
    const int64_t affordable = std::max<int64_t>(
        std::max<int64_t>(0, r.default_bytes - r.fixed_bytes) / r.bytes_per_block, seq_blocks);
    plan.num_blocks = ClampBlocks(std::min(wanted, affordable));
    plan.budget_bytes = plan.num_blocks * r.bytes_per_block;
  }
  plan.pool_bytes = plan.num_blocks * r.bytes_per_block;
  plan.num_tokens = int64_t{plan.num_blocks} * r.block_size;

  const std::string key = plan.sized_from == "default" ? "cache.memory_fraction" : plan.sized_from;
  if (r.enforce_available && plan.pool_bytes + r.fixed_bytes > usable) {
    return absl::ResourceExhaustedError(absl::StrCat(
        key, ": a pool of ", plan.num_blocks, " blocks needs ", GiB(plan.pool_bytes), " but only ",
        GiB(usable), " are left after ", GiB(r.weight_bytes), " of weights, ",
        GiB(r.activation_bytes), " of activations and ", GiB(r.reserve_bytes), " reserved"));
  }
  if (plan.num_blocks < std::max<int64_t>(1, seq_blocks)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        key, ": the KV pool holds ", plan.num_blocks, " blocks (", GiB(plan.budget_bytes), ", ",
        r.bytes_per_block, " bytes per block), but one sequence of max_model_len ", r.max_model_len,
        " needs ", seq_blocks,
        "; give the cache more memory, lower scheduler.max_model_len or choose a smaller "
        "cache.kv_dtype"));
  }
  return plan;
}

std::string DescribeKvPool(const KvPoolRequest& r, const KvPoolPlan& plan) {
  std::string out = absl::StrFormat(
      "KV pool: %d blocks x %.2f MiB = %s, %d tokens (", plan.num_blocks,
      static_cast<double>(r.bytes_per_block) / (1 << 20), GiB(plan.pool_bytes), plan.num_tokens);
  if (plan.sized_from == "cache.num_blocks" || plan.sized_from == "cache.memory_bytes") {
    absl::StrAppend(&out, plan.sized_from, ")");
  } else if (r.memory_fraction > 0 || r.default_fraction > 0) {
    const double fraction = r.memory_fraction > 0 ? r.memory_fraction : r.default_fraction;
    absl::StrAppend(&out, plan.sized_from, " ", fraction, " of ", GiB(r.available_bytes),
                    " left after ", GiB(r.weight_bytes), " of weights and ",
                    GiB(r.activation_bytes), " of activations)");
  } else {
    absl::StrAppend(&out, "default: ", r.max_num_seqs, " sequences of ", r.max_model_len,
                    " tokens, at most ", GiB(r.default_bytes), ")");
  }
  return out;
}

}  // namespace kvserve
