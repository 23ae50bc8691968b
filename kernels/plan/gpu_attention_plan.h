// GpuAttentionPlan: the host-side plan of one CUDA paged-attention call (all
// layers of a step share it), computed in plain C++ from the host BatchView
// and uploaded by the caller as one small int32 array. It decides
//   - how query rows are cut into tiles: a tile is up to kRowsPerTile
//     consecutive rows of one sequence, so that rows x heads_per_cta query
//     vectors (at most kGpuAttentionMaxQueryVectors) share every K/V page a
//     CTA reads; a decode row is a tile of one row;
//   - how a tile's key range is split into partitions (flash-decoding), so
//     that a step with few long sequences still fills the GPU, and which rows
//     need their partial results merged;
//   - the launch shape and the workspace the partials need.
// kernels/cuda/attention/paged_attention.h runs it; the CPU backend does not need it.
//
// Grid of the attention kernel: (num_items, num_heads / heads_per_cta). CTA
// (x, y) serves work item x for query heads [y * hpc, (y + 1) * hpc), which
// all read kv head (y * hpc) / group: each K/V page is read once per group
// (once per hpc heads when a group is larger than 16 heads).
//
// Partitions: with split size C (keys), a tile whose keys are [kb, ke) is cut
// at the absolute multiples of C, so partition boundaries fall on page
// boundaries for every power-of-two block size dividing C. Auto mode picks
// the smallest C, a multiple of partition_granule, for which the CTAs of the
// split plan fit in num_sms * ctas_per_sm, and does not split at all when the
// unsplit plan already fills that; fixed mode (fixed_partition_keys > 0) uses
// one C for every step, so the sizes stay bounded for CUDA graph capture.
//
// Upload layout (words(), int32, 16-byte aligned when the caller places it
// so; every record is a whole number of 16-byte units):
//   [0, 8)                       GpuAttentionPlanHeader
//   [items_offset, +8*num_items) GpuAttentionWorkItem, heaviest first
//   [merges_offset, +4*num_merges) GpuAttentionMergeItem, ascending rows
// The kernels read the counts and offsets from the uploaded header, so a
// grid sized for a capacity (graph replay) exits early past the real counts.
//
// Example (runner, per step):
//   absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(batch), shape, options);
//   memcpy(staging + off, plan->words().data(), plan->words().size() * 4);  // with the batch
//   ... one upload ...; PagedAttentionParams::plan = device + off; launch = plan->launch();
//
// Thread-safety: pure functions and an immutable value.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/paged_view.h"

namespace kvserve {

// Query vectors (rows x heads) one CTA serves; the kernels size their tiles by it.
inline constexpr int32_t kGpuAttentionMaxQueryVectors = 16;
// Largest head_dim the kernels take (and the smallest, even, step).
inline constexpr int32_t kGpuAttentionMaxHeadDim = 256;

struct GpuAttentionPlanHeader {
  int32_t num_items = 0;       // work items (grid x)
  int32_t num_merges = 0;      // rows whose partials the merge kernel combines
  int32_t num_partials = 0;    // partial slots used in the workspace
  int32_t heads_per_cta = 0;   // query heads per CTA (grid y = num_heads / heads_per_cta)
  int32_t rows_per_tile = 0;   // most rows in one item
  int32_t partition_keys = 0;  // split size C in keys; 0: nothing was split
  int32_t items_offset = 0;    // in words, from the start of the array
  int32_t merges_offset = 0;   // in words
};

// One CTA's work (per head chunk): rows [row_begin, row_begin + num_rows) of
// sequence seq (consecutive cache indices, the first at
// batch.CacheIndex(seq, row_begin)) over keys [key_begin, key_end); row r
// still masks keys outside [KeyBegin(i_r, window), i_r]. partial < 0: the
// item covers every key of its rows and writes out; else row i writes its
// unnormalised result to workspace slot partial + i.
struct GpuAttentionWorkItem {
  int32_t seq = 0;
  int32_t row_begin = 0;
  int32_t num_rows = 0;
  int32_t key_begin = 0;
  int32_t key_end = 0;
  int32_t partial = -1;
  int32_t reserved[2] = {0, 0};
};

// Row `row`'s partials are slots first_partial + p * stride, p < num_partials.
struct GpuAttentionMergeItem {
  int32_t row = 0;
  int32_t first_partial = 0;
  int32_t num_partials = 0;
  int32_t stride = 0;
};

static_assert(sizeof(GpuAttentionPlanHeader) == 32);
static_assert(sizeof(GpuAttentionWorkItem) == 32);
static_assert(sizeof(GpuAttentionMergeItem) == 16);

// The attention shape (per layer; every layer of a model shares it).
struct GpuAttentionShape {
  int32_t num_heads = 0;       // query heads
  int32_t num_kv_heads = 0;    // divides num_heads
  int32_t head_dim = 0;        // even, <= kGpuAttentionMaxHeadDim
  int32_t sliding_window = 0;  // 0: full causal attention
};

struct GpuAttentionPlanOptions {
  int32_t num_sms = 132;             // cudaDevAttrMultiProcessorCount
  int32_t ctas_per_sm = 4;           // CTAs one SM keeps busy (auto split target)
  int32_t partition_granule = 256;   // auto split sizes are multiples of this
  int32_t fixed_partition_keys = 0;  // > 0: always split at multiples of this
  bool split = true;                 // false: never split (one item per tile)
};

// Launch sizes the host needs (a copy of the header's counts).
struct GpuAttentionLaunch {
  int32_t num_items = 0;
  int32_t num_merges = 0;
  int32_t num_partials = 0;
  int32_t heads_per_cta = 0;
};

class GpuAttentionPlan {
 public:
  const GpuAttentionPlanHeader& header() const { return header_; }
  GpuAttentionLaunch launch() const {
    return {header_.num_items, header_.num_merges, header_.num_partials, header_.heads_per_cta};
  }
  const std::vector<GpuAttentionWorkItem>& items() const { return items_; }
  const std::vector<GpuAttentionMergeItem>& merges() const { return merges_; }
  // The upload image (see the layout above).
  const std::vector<int32_t>& words() const { return words_; }
  int64_t bytes() const { return static_cast<int64_t>(words_.size()) * 4; }

 private:
  friend absl::StatusOr<GpuAttentionPlan> PlanGpuAttention(const BatchView&,
                                                           const GpuAttentionShape&,
                                                           const GpuAttentionPlanOptions&);
  GpuAttentionPlanHeader header_;
  std::vector<GpuAttentionWorkItem> items_;
  std::vector<GpuAttentionMergeItem> merges_;
  std::vector<int32_t> words_;
};

// Query heads one CTA serves: the largest divisor of the GQA group that is
// at most kGpuAttentionMaxQueryVectors.
int32_t GpuAttentionHeadsPerCta(int32_t num_heads, int32_t num_kv_heads);

// InvalidArgument naming the field for a bad shape, option or batch
// (query_start not ascending from 0 to num_tokens, context_len below a
// sequence's row count). Sequences without rows get no items.
absl::StatusOr<GpuAttentionPlan> PlanGpuAttention(const BatchView& batch,
                                                  const GpuAttentionShape& shape,
                                                  const GpuAttentionPlanOptions& options);

// The split-KV workspace: num_partials slots of GpuAttentionSlotFloats
// floats each. Slot p holds, for every query head h, the running max and sum
// of its partition at [2h, 2h + 1] and the unnormalised accumulators at
// [2 * num_heads + h * head_dim, + head_dim). fp32 throughout.
int64_t GpuAttentionSlotFloats(const GpuAttentionShape& shape);
int64_t GpuAttentionWorkspaceBytes(const GpuAttentionShape& shape, int64_t num_partials);

// Upper bounds over every batch of at most max_tokens rows whose sequences
// have at most max_context cached tokens, for preallocating the workspace
// and the upload area once.
struct GpuAttentionPlanBounds {
  int64_t max_items = 0;
  int64_t max_merges = 0;
  int64_t max_partials = 0;
  int64_t max_words = 0;
  int64_t workspace_bytes = 0;
};
GpuAttentionPlanBounds GpuAttentionBounds(const GpuAttentionShape& shape,
                                          const GpuAttentionPlanOptions& options,
                                          int64_t max_tokens, int64_t max_context);

}  // namespace kvserve
