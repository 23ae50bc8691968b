#include "kernels/plan/attention_plan.h"

#include <algorithm>

namespace kvserve {

int64_t CountAttentionKeys(const BatchView& batch, int32_t sliding_window) {
  int64_t total = 0;
  for (int32_t b = 0; b < batch.num_seqs; ++b) {
    const int32_t first = batch.FirstIndex(b);
    for (int32_t i = 0; i < batch.QueryLen(b); ++i) total += NumKeys(first + i, sliding_window);
  }
  return total;
}

std::vector<int32_t> SplitRowsByAttentionCost(const BatchView& batch, int32_t sliding_window,
                                              int parts, int64_t row_overhead) {
  const int32_t T = batch.num_tokens;
  parts = std::clamp(parts, 1, std::max(1, T));
  std::vector<int32_t> bounds(parts + 1, T);
  bounds[0] = 0;
  const int64_t total = CountAttentionKeys(batch, sliding_window) + row_overhead * T;
  int64_t acc = 0;
  int part = 1;
  for (int32_t b = 0; b < batch.num_seqs && part < parts; ++b) {
    const int32_t first = batch.FirstIndex(b);
    for (int32_t i = 0; i < batch.QueryLen(b) && part < parts; ++i) {
      acc += NumKeys(first + i, sliding_window) + row_overhead;
      const int32_t r = batch.query_start[b] + i;
      while (part < parts && acc * parts >= total * part) bounds[part++] = r + 1;
    }
  }
  return bounds;
}

}  // namespace kvserve
