// Teacher forcing: a reference runner's logits along another backend's
// token sequence, and the check the [gpu] and stand-in tests of 4-bit KV
// formats make with it: every greedy token the backend under test picked
// is the reference's choice, or within `near_tie` of it, given the same
// history (tests/cuda_stub/cuda_runner_stub_test.cc says why 4-bit KV
// admits nothing tighter across backends).
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/batch_input.h"
#include "model/model_runner.h"

namespace kvserve::testing {

// The reference's logits for each of `tokens` after `prompt`: one sequence
// in blocks 0.. (tail 0 when the runner keeps tails), the prompt in chunks
// of at most `chunk` rows, then one row per step. out[k] predicts tokens[k].
inline std::vector<std::vector<float>> TeacherForced(ModelRunner& ref,
                                                     const std::vector<int32_t>& prompt,
                                                     const std::vector<int32_t>& tokens,
                                                     int32_t chunk) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const int bs = ref.kv_format().block_size();
  const int32_t width = static_cast<int32_t>((all.size() + bs - 1) / bs);
  REQUIRE(width <= ref.num_blocks());
  const int32_t plen = static_cast<int32_t>(prompt.size());
  std::vector<std::vector<float>> out;
  int32_t cached = 0;
  while (out.size() < tokens.size()) {
    const int32_t n = cached < plen ? std::min(chunk, plen - cached) : 1;
    BatchInput b;
    b.Clear();
    b.max_blocks_per_seq = width;
    for (int32_t i = cached; i < cached + n; ++i) {
      b.token_ids.push_back(all[i]);
      b.positions.push_back(i);
      b.slot_mapping.push_back(i);  // block k holds indices [k * bs, (k + 1) * bs)
    }
    b.query_start.push_back(n);
    b.context_len.push_back(cached + n);
    for (int32_t k = 0; k < width; ++k) b.block_table.push_back(k);
    b.logits_rows.push_back(n - 1);
    if (ref.num_tail_blocks() > 0) b.tail_ids.push_back(0);
    std::vector<float> logits(static_cast<size_t>(ref.config().vocab_size));
    const absl::Status st = ref.Forward(b, logits);
    INFO(st.ToString());
    REQUIRE(st.ok());
    cached += n;
    if (cached >= plen) out.push_back(std::move(logits));
  }
  return out;
}

// Requires ref's logit of every tokens[k] to be within near_tie of its
// maximum; returns how many are not the maximum itself (near ties).
inline int RequireNearGreedy(ModelRunner& ref, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& tokens, float near_tie,
                             int32_t chunk = 32) {
  const std::vector<std::vector<float>> logits = TeacherForced(ref, prompt, tokens, chunk);
  int ties = 0;
  for (size_t k = 0; k < tokens.size(); ++k) {
    INFO("generated position " << k << ", token " << tokens[k]);
    const std::vector<float>& l = logits[k];
    const float best = *std::max_element(l.begin(), l.end());
    REQUIRE(l[tokens[k]] >= best - near_tie);
    ties += l[tokens[k]] < best;
  }
  return ties;
}

}  // namespace kvserve::testing
