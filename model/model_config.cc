#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {

std::string_view WeightQuantName(WeightQuant q) {
  switch (q) {
    case WeightQuant::kNone:
      return "fp32";
    case WeightQuant::kInt8:
      return "int8";
    case WeightQuant::kInt4:
      return "int4";
    case WeightQuant::kInt4Asym:
      return "int4_asym";
    case WeightQuant::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "?";
}

WeightQuantSpec WeightQuantSpec::Resolve(int vocab_size) const {
  WeightQuantSpec r = *this;
  if (head_auto) {
    const WeightQuant big = body == WeightQuant::kFp8E4m3 ? body : WeightQuant::kInt8;
    r.head =
        body != WeightQuant::kNone && vocab_size >= kInt8HeadMinVocab ? big : WeightQuant::kNone;
  }
  r.head_auto = false;
  return r;
}

std::string WeightQuantSpec::ToString() const {
  std::string s(WeightQuantName(body));
  if (!head_auto && head != body) {
    s += absl::StrCat("+head ", std::string(WeightQuantName(head)));
  }
  if ((IsInt4(body) || IsInt4(head)) && group_size != 32) {
    s += absl::StrCat("/g", group_size);
  }
  return s;
}

absl::StatusOr<WeightQuantSpec> ParseWeightQuant(std::string_view body, std::string_view head,
                                                 int group_size) {
  auto lower = [](std::string_view t) {
    return absl::AsciiStrToLower(absl::StripAsciiWhitespace(std::string(t)));
  };
  auto parse = [](const std::string& t, const char* key,
                  bool allow_auto) -> absl::StatusOr<std::optional<WeightQuant>> {
    if (t == "auto" || t.empty()) {
      if (allow_auto) return std::optional<WeightQuant>();
    }
    if (t == "fp32" || t == "float32" || t == "fp16" || t == "float16" || t == "bf16" ||
        t == "bfloat16" || (t == "auto" && !allow_auto)) {
      return std::optional<WeightQuant>(WeightQuant::kNone);
    }
    if (t == "int8") return std::optional<WeightQuant>(WeightQuant::kInt8);
    if (t == "int4") return std::optional<WeightQuant>(WeightQuant::kInt4);
    if (t == "int4_asym") return std::optional<WeightQuant>(WeightQuant::kInt4Asym);
    if (t == "fp8_e4m3" || t == "fp8") return std::optional<WeightQuant>(WeightQuant::kFp8E4m3);
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": expected auto, fp32, fp16, bf16, int8, int4, int4_asym or fp8_e4m3, got '", t,
        "'"));
  };
  WeightQuantSpec spec;
  KV_ASSIGN_OR_RETURN(std::optional<WeightQuant> b,
                      parse(lower(body), "model.weight_dtype", false));
  spec.body = *b;
  KV_ASSIGN_OR_RETURN(std::optional<WeightQuant> h,
                      parse(lower(head), "model.weight_dtype_head", true));
  spec.head_auto = !h.has_value();
  spec.head = h ? *h : WeightQuant::kNone;
  const bool cpu_dtype = spec.body == WeightQuant::kInt8 || IsInt4(spec.body) ||
                         spec.head == WeightQuant::kInt8 || IsInt4(spec.head);
  if (spec.fp8() && cpu_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.weight_dtype_head: ", std::string(WeightQuantName(spec.head)),
        " beside model.weight_dtype: ", std::string(WeightQuantName(spec.body)),
        ": fp8_e4m3 runs on the CUDA runner, int8 and int4 on the CPU runner; pick one kind"));
  }
  if (group_size < 8 || group_size > 4096 || group_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.weight_group_size: expected a multiple of 8 in [8, 4096] (32 or 128), got ",
        group_size));
  }
  spec.group_size = group_size;
  return spec;
}

absl::Status ModelConfig::Validate() const {
  auto bad = [](const char* field, int64_t v, const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", field, " = ", v, ": ", why));
  };
  if (dim <= 0) return bad("dim", dim, "must be > 0");
  if (hidden_dim <= 0) return bad("hidden_dim", hidden_dim, "must be > 0");
  if (num_layers <= 0) return bad("num_layers", num_layers, "must be > 0");
  if (num_heads <= 0) return bad("num_heads", num_heads, "must be > 0");
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return bad("num_kv_heads", num_kv_heads, "must be > 0 and divide num_heads");
  }
  if (head_dim <= 0 || head_dim % 2 != 0) return bad("head_dim", head_dim, "must be even and > 0");
  if (vocab_size <= 0) return bad("vocab_size", vocab_size, "must be > 0");
  if (max_position_embeddings <= 0) {
    return bad("max_position_embeddings", max_position_embeddings, "must be > 0");
  }
  if (!(rope_theta > 0)) return absl::InvalidArgumentError("model config: rope_theta must be > 0");
  if (!(rms_norm_eps > 0)) {
    return absl::InvalidArgumentError("model config: rms_norm_eps must be > 0");
  }
  if (sliding_window < 0) return bad("sliding_window", sliding_window, "must be >= 0");
  if (rope_scaling.type != RopeScalingType::kNone) {
    if (!(rope_scaling.factor >= 1.0f)) {
      return absl::InvalidArgumentError("model config: rope_scaling.factor must be >= 1");
    }
    if (rope_scaling.type == RopeScalingType::kLlama3 &&
        (rope_scaling.original_max_position_embeddings <= 0 ||
         !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))) {
      return absl::InvalidArgumentError(
          "model config: rope_scaling llama3 needs original_max_position_embeddings > 0 and "
          "high_freq_factor > low_freq_factor");
    }
  }
  return absl::OkStatus();
}

void ModelConfig::AddStopId(int32_t id) {
  if (id != eos_id && std::find(stop_ids.begin(), stop_ids.end(), id) == stop_ids.end()) {
    stop_ids.push_back(id);
  }
}

bool ModelConfig::IsStopToken(int32_t id) const {
  return id == eos_id || (bos_is_stop && id == bos_id) ||
         std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
}

int64_t ModelConfig::NumParams() const {
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t per_layer = 2LL * dim + dim * q + 2 * dim * kv + q * dim + 3LL * dim * hidden_dim +
                            (qkv_bias ? q + 2 * kv : 0) + (o_bias ? dim : 0) +
                            (qk_norm ? 2LL * head_dim : 0);
  const int64_t embed = static_cast<int64_t>(vocab_size) * dim;
  return per_layer * num_layers + dim + embed * (tie_word_embeddings ? 1 : 2);
}

SamplingParams ModelConfig::DefaultSampling() const {
  SamplingParams p;
  if (default_temperature) p.temperature = *default_temperature;
  if (default_top_p) p.top_p = *default_top_p;
  if (default_top_k) p.top_k = *default_top_k;
  return p;
}

std::vector<float> ModelConfig::RopeInvFreq() const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int j = 0; j < half; ++j) {
    inv[j] = 1.0f / powf(rope_theta, static_cast<float>(2 * j) / static_cast<float>(head_dim));
  }
  const RopeScaling& s = rope_scaling;
  if (s.type == RopeScalingType::kLinear) {
    for (float& f : inv) f /= s.factor;
  } else if (s.type == RopeScalingType::kLlama3) {
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const float low_wavelen = old_len / s.low_freq_factor;
    const float high_wavelen = old_len / s.high_freq_factor;
    constexpr float kPi = 3.14159265358979323846f;
    for (float& f : inv) {
      const float wavelen = 2.0f * kPi / f;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const float smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0f - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace kvserve
