#include "model/sampling/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "util/field_status.h"

namespace kvserve {

absl::Status SamplingParams::Validate() const {
  auto bad = [](const char* field, double v, const char* rule) {
    return FieldError(field, absl::StrCat(field, " must be ", rule, ", got ", v));
  };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return bad("temperature", temperature, ">= 0");
  }
  if (top_k < -1) return bad("top_k", top_k, "-1, 0 (off) or positive");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0.0f && min_p < 1.0f)) return bad("min_p", min_p, "in [0, 1)");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return bad("repetition_penalty", repetition_penalty, "> 0");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return bad("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  return absl::OkStatus();
}

}  // namespace kvserve
