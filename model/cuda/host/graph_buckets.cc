#include "model/cuda/host/graph_buckets.h"

#include <algorithm>

namespace kvserve {

std::vector<int32_t> GraphBatchBuckets(int32_t max_num_seqs) {
  std::vector<int32_t> buckets;
  for (int32_t b : {1, 2, 4}) {
    if (b <= max_num_seqs) buckets.push_back(b);
  }
  for (int32_t b = 8; b <= max_num_seqs; b += 8) buckets.push_back(b);
  if (max_num_seqs >= 1 && buckets.back() != max_num_seqs) buckets.push_back(max_num_seqs);
  return buckets;
}

int32_t GraphBucketFor(const std::vector<int32_t>& buckets, int32_t batch) {
  if (batch < 1) return 0;
  auto it = std::lower_bound(buckets.begin(), buckets.end(), batch);
  return it == buckets.end() ? 0 : *it;
}

int32_t GraphPartitionKeys(int32_t) { return kAttentionPartitionKeys; }

GraphAttention GraphAttentionFor(const GpuAttentionShape& shape,
                                 const GpuAttentionPlanOptions& base, int32_t bucket,
                                 int64_t max_context) {
  GraphAttention g;
  g.options = base;
  g.options.fixed_partition_keys = GraphPartitionKeys(bucket);
  const GpuAttentionPlanBounds b = GpuAttentionBounds(shape, g.options, bucket, max_context);
  g.launch.num_items = static_cast<int32_t>(b.max_items);
  g.launch.num_partials = static_cast<int32_t>(b.max_partials);
  // No partials (every context fits one partition): nothing to merge.
  g.launch.num_merges = b.max_partials > 0 ? static_cast<int32_t>(b.max_merges) : 0;
  g.launch.heads_per_cta = GpuAttentionHeadsPerCta(shape.num_heads, shape.num_kv_heads);
  g.max_words = b.max_words;
  g.workspace_bytes = b.workspace_bytes;
  return g;
}

}  // namespace kvserve
