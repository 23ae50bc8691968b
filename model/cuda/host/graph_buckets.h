// CUDA-graph batch-size buckets: the decode batch sizes the CUDA runner
// captures a graph for, and which graph a decode step replays.
//
// Buckets are 1, 2, 4, 8 and then every multiple of 8 up to max_num_seqs,
// with max_num_seqs itself last (vLLM's capture sizes): a step of B
// sequences replays the smallest bucket >= B, so at most 7 padded rows (3
// below 8) run for nothing. With graphs off, or B above the largest bucket,
// the step runs eagerly.
//
// Example: max_num_seqs 20 -> {1, 2, 4, 8, 16, 20}; B = 9 replays 16.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve {

// Ascending, distinct, all in [1, max_num_seqs]; empty when max_num_seqs < 1.
std::vector<int32_t> GraphBatchBuckets(int32_t max_num_seqs);

// The smallest bucket >= batch, or 0 when there is none (run eagerly).
// buckets must be ascending.
int32_t GraphBucketFor(const std::vector<int32_t>& buckets, int32_t batch);

// The split-KV partition size (keys) of every attention plan the CUDA
// runner makes, eager or captured: a row's keys split at multiples of
// kAttentionPartitionKeys whatever batch or bucket it is in, so its merged
// result (and its logits) are the same bits alone, batched or replayed from
// any bucket's graph (batch invariance, issue 23). It used to shrink with
// the bucket (256 keys up to 8 sequences) and eager plans split by the
// whole batch's size. 512 keys: a long decode still fills the GPU (8k
// context, 32 heads in 8 CTA rows: 128 CTAs for one sequence), and the
// eager workspace stays small next to the KV pool (8192 rows at 8192 keys,
// Llama-3-8B: 16 partitions a row, 2.2 GB).
inline constexpr int32_t kAttentionPartitionKeys = 512;
// kAttentionPartitionKeys for every bucket (kept for the captures' options).
int32_t GraphPartitionKeys(int32_t bucket);

// What a bucket's graph is captured with: the attention plan options (base
// with the bucket's fixed partition size), the launch capacities baked into
// the graph (every decode batch of at most `bucket` sequences of at most
// max_context tokens plans within them; CTAs past a step's real counts
// exit), and the upload and workspace sizes those capacities need.
struct GraphAttention {
  GpuAttentionPlanOptions options;
  GpuAttentionLaunch launch;
  int64_t max_words = 0;
  int64_t workspace_bytes = 0;
};
GraphAttention GraphAttentionFor(const GpuAttentionShape& shape,
                                 const GpuAttentionPlanOptions& base, int32_t bucket,
                                 int64_t max_context);

}  // namespace kvserve
