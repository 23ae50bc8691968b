#include "kernels/plan/sampling_batch.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status Bad(const char* field, double value, const char* rule) {
  return absl::InvalidArgumentError(absl::StrCat(field, " must be ", rule, ", got ", value));
}

absl::Status CheckIds(absl::Span<const int32_t> ids, int32_t vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SamplingBatch::AddRow(const SampleRowParams& params, absl::Span<const int32_t> prompt,
                                   absl::Span<const int32_t> output) {
  if (vocab_ < 1 || vocab_ > kMaxSampleVocab) return Bad("vocab", vocab_, "in [1, 2^20]");
  const SampleRowParams& p = params;
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Bad("temperature", p.temperature, ">= 0 and finite");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return Bad("top_p", p.top_p, "in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) return Bad("min_p", p.min_p, "in [0, 1)");
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return Bad("repetition_penalty", p.repetition_penalty, "> 0 and finite");
  }
  if (!std::isfinite(p.frequency_penalty)) {
    return Bad("frequency_penalty", p.frequency_penalty, "finite");
  }
  if (!std::isfinite(p.presence_penalty)) {
    return Bad("presence_penalty", p.presence_penalty, "finite");
  }
  if (p.num_top_logprobs < -1 || p.num_top_logprobs > kMaxTopLogprobs) {
    return Bad("num_top_logprobs", p.num_top_logprobs, "in [-1, 20]");
  }
  SampleRowParams row = p;
  row.history_begin = static_cast<int64_t>(history_.size());
  row.prompt_len = 0;
  row.output_len = 0;
  if (UsesHistory(p)) {
    if (output.size() >= (size_t{1} << 30)) {
      return Bad("output length", static_cast<double>(output.size()), "< 2^30");
    }
    if (prompt.size() >= (size_t{1} << 31)) {
      return Bad("prompt length", static_cast<double>(prompt.size()), "< 2^31");
    }
    KV_RETURN_IF_ERROR(CheckIds(prompt, vocab_, "prompt"));
    KV_RETURN_IF_ERROR(CheckIds(output, vocab_, "output"));
    row.prompt_len = static_cast<int32_t>(prompt.size());
    row.output_len = static_cast<int32_t>(output.size());
    history_.insert(history_.end(), prompt.begin(), prompt.end());
    history_.insert(history_.end(), output.begin(), output.end());
  }
  rows_.push_back(row);
  return absl::OkStatus();
}

void SamplingBatch::PackInto(uint8_t* dst) const {
  if (!rows_.empty()) std::memcpy(dst, rows_.data(), rows_.size() * sizeof(SampleRowParams));
  if (!history_.empty()) {
    std::memcpy(dst + HistoryByteOffset(), history_.data(), history_.size() * sizeof(int32_t));
  }
}

}  // namespace kvserve
