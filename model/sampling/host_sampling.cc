#include "model/sampling/host_sampling.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {

absl::Status ValidateSampleRows(std::span<const SampleRow> rows, size_t out_size,
                                int64_t num_logits_rows, bool masks_supported) {
  if (out_size != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sample: ", rows.size(), " rows but ", out_size, " outputs"));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& r = rows[i];
    if (r.logits_index < 0 || r.logits_index >= num_logits_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sample: rows[", i, "].logits_index = ", r.logits_index,
                       " is outside the last batch's ", num_logits_rows, " logits rows"));
    }
    if (r.params == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("Sample: rows[", i, "].params is null"));
    }
    if (r.num_logprobs < -1 || r.num_logprobs > kMaxSampleLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat("Sample: rows[", i,
                                                     "].num_logprobs = ", r.num_logprobs,
                                                     " is outside [-1, ", kMaxSampleLogprobs, "]"));
    }
    if (!r.allowed.empty() && !masks_supported) {
      return absl::UnimplementedError(absl::StrCat(
          "Sample: rows[", i, "] has a token mask, which this sampler does not apply yet"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostRowSampler::Sample(std::span<const float> logits, int32_t vocab,
                                    std::span<const SampleRow> rows, std::span<SampledToken> out) {
  const int64_t num_logits_rows = vocab > 0 ? static_cast<int64_t>(logits.size()) / vocab : 0;
  KV_RETURN_IF_ERROR(
      ValidateSampleRows(rows, out.size(), num_logits_rows, /*masks_supported=*/true));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].allowed.empty()) {
      const std::span<const uint32_t> a = rows[i].allowed;
      if (a.size() != static_cast<size_t>((vocab + 31) / 32)) {
        return absl::InvalidArgumentError(absl::StrCat("Sample: rows[", i, "].allowed has ",
                                                       a.size(), " words; vocab ", vocab, " needs ",
                                                       (vocab + 31) / 32));
      }
      if (std::all_of(a.begin(), a.end(), [](uint32_t w) { return w == 0; })) {
        return absl::InvalidArgumentError(
            absl::StrCat("Sample: rows[", i, "].allowed allows no token"));
      }
    }
    if (!rows[i].params->is_greedy() && rows[i].state == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sample: rows[", i, "] draws at random but has no generator state"));
    }
  }
  row_.resize(vocab);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& r = rows[i];
    const float* src = logits.data() + static_cast<int64_t>(r.logits_index) * vocab;
    std::copy(src, src + vocab, row_.begin());
    SampledToken& o = out[i];
    o.top.clear();
    if (r.num_logprobs < 0) {
      o.token =
          sampler_.Sample(row_, *r.params, r.prompt, r.output, r.state, nullptr, 0, r.allowed);
      o.logprob = 0.0f;
      continue;
    }
    o.token = sampler_.Sample(row_, *r.params, r.prompt, r.output, r.state, &logprobs_,
                              r.num_logprobs, r.allowed);
    o.logprob = logprobs_.chosen.logprob;
    for (const SampledLogprob& t : logprobs_.top) o.top.emplace_back(t.token, t.logprob);
  }
  return absl::OkStatus();
}

}  // namespace kvserve
