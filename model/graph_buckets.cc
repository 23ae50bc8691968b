#include "model/graph_buckets.h"

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

int32_t GraphPartitionKeys(int32_t bucket) {
  if (bucket <= 8) return 256;
  if (bucket <= 32) return 512;
  return 1024;
}

}  // namespace kvserve
