// Internal to the scalar PagedAttention paths (paged_attention.cc for plain
// pages, paged_attention_kc.cc for int4_kc): the attention of one query row
// for one kv head's GQA group, given how to decode a key's K or V row. Per
// group it scores keys [lo, idx] (one decoded head_dim row at a time, never
// more), takes an exact two-pass softmax and sums the decoded V rows; the
// two layouts differ only in where a key's row lives.
//
// Thread-safety: reentrant (scratch in thread_local buffers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvserve::cpu::internal {

// query(j): the [group][hd] queries key j is scored with (sink keys may use
// others). decode(v, j, row): K (v = false) or V of key j into row[hd].
// mass (or null): adds each key's softmax weight, summed over the group, at
// mass[j - lo]. out: [group][hd].
template <typename Query, typename Decode>
void AttendGroupScalar(int group, int hd, int32_t lo, int32_t idx, float scale, const Query& query,
                       const Decode& decode, float* mass, float* out) {
  thread_local std::vector<float> scores, row, acc, sums;
  const int32_t n = idx - lo + 1;
  row.resize(hd);
  sums.resize(group);
  acc.assign(static_cast<size_t>(group) * hd, 0.0f);
  scores.resize(static_cast<size_t>(group) * n);
  for (int32_t i = lo; i <= idx; ++i) {
    const float* q = query(i);
    decode(false, i, row.data());
    for (int g = 0; g < group; ++g) {
      float s = 0.0f;
      for (int d = 0; d < hd; ++d) s += q[g * hd + d] * row[d];
      scores[static_cast<size_t>(g) * n + (i - lo)] = s * scale;
    }
  }
  for (int g = 0; g < group; ++g) {
    float* s = scores.data() + static_cast<size_t>(g) * n;
    const float maxs = *std::max_element(s, s + n);
    float total = 0.0f;
    for (int32_t i = 0; i < n; ++i) {
      s[i] = std::exp(s[i] - maxs);
      total += s[i];
    }
    sums[g] = total;
    if (mass != nullptr) {
      for (int32_t i = 0; i < n; ++i) mass[i] += s[i] / total;
    }
  }
  for (int32_t i = lo; i <= idx; ++i) {
    decode(true, i, row.data());
    for (int g = 0; g < group; ++g) {
      const float w = scores[static_cast<size_t>(g) * n + (i - lo)];
      float* a = acc.data() + static_cast<size_t>(g) * hd;
      for (int d = 0; d < hd; ++d) a[d] += w * row[d];
    }
  }
  for (int g = 0; g < group; ++g) {
    const float inv = 1.0f / sums[g];
    for (int d = 0; d < hd; ++d) out[g * hd + d] = acc[static_cast<size_t>(g) * hd + d] * inv;
  }
}

}  // namespace kvserve::cpu::internal
