#include "model/batch_tails.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvserve {

absl::Status ValidateBatchTails(const BatchInput& batch, int32_t num_tails, int32_t block_size) {
  const int32_t B = batch.num_seqs();
  if (static_cast<int32_t>(batch.tail_ids.size()) != B) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchInput: tail_ids has ", batch.tail_ids.size(),
                     " entries, want one per sequence (", B, ") with an int4_kc cache"));
  }
  std::vector<int32_t> used;
  for (int32_t b = 0; b < B; ++b) {
    const int32_t q_len = batch.query_start[b + 1] - batch.query_start[b];
    const int32_t ctx = batch.context_len[b];
    if (q_len == 0) continue;
    const int32_t t = batch.tail_ids[b];
    const bool needed = (ctx - q_len) % block_size != 0 || ctx % block_size != 0;
    if (t == -1 && !needed) continue;
    if (t < 0 || t >= num_tails) {
      return absl::InvalidArgumentError(
          absl::StrCat("BatchInput: tail_ids[", b, "] = ", t, " is not a tail (the pool has ",
                       num_tails, ")", needed ? "; its step reads or writes a partial block" : ""));
    }
    used.push_back(t);
  }
  std::sort(used.begin(), used.end());
  if (std::adjacent_find(used.begin(), used.end()) != used.end()) {
    return absl::InvalidArgumentError("BatchInput: two sequences of the step name the same tail");
  }
  return absl::OkStatus();
}

}  // namespace kvserve
