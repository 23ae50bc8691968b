#include "cache/format/kv_dtype_spec.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvserve {
namespace {

absl::Status Bad(std::string_view what, std::string_view text, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(what), ": '", std::string(text), "' ", why,
      " (a dtype, or a per-layer list such as int8,int4_kc*,int8: NAME is one layer, NAME*N "
      "N layers, NAME* the layers left)"));
}

}  // namespace

absl::StatusOr<KvDtypeSpec> KvDtypeSpec::Parse(std::string_view text, std::string_view what) {
  KvDtypeSpec spec;
  spec.entries_.clear();
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ',');
  int fills = 0;
  for (absl::string_view raw : parts) {
    const absl::string_view part = absl::StripAsciiWhitespace(raw);
    if (part.empty()) return Bad(what, text, "has an empty entry");
    const size_t star = part.find('*');
    const absl::string_view name = absl::StripAsciiWhitespace(part.substr(0, star));
    absl::StatusOr<KvDtype> dtype = ParseKvDtype(std::string_view(name.data(), name.size()));
    if (!dtype.ok()) {
      return Bad(what, text,
                 absl::StrCat("names an unknown dtype '", std::string(name),
                              "' (one of fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4, int4_kc, "
                              "int2_kc)"));
    }
    int count = 1;
    if (star != absl::string_view::npos) {
      const absl::string_view n = absl::StripAsciiWhitespace(part.substr(star + 1));
      if (n.empty()) {
        count = kFill;
        if (++fills > 1) return Bad(what, text, "has more than one NAME* entry");
      } else if (!absl::SimpleAtoi(n, &count) || count < 1 || count > (1 << 20)) {
        return Bad(what, text, absl::StrCat("has a bad repeat '", std::string(part), "'"));
      }
    }
    spec.entries_.push_back({*dtype, count});
  }
  // A lone name covers every layer.
  if (spec.entries_.size() == 1 && spec.entries_[0].count == 1 &&
      text.find('*') == std::string_view::npos) {
    spec.entries_[0].count = kFill;
  }
  return spec;
}

absl::StatusOr<std::vector<KvDtype>> KvDtypeSpec::Resolve(int num_layers,
                                                          std::string_view what) const {
  int64_t fixed = 0;
  bool fill = false;
  for (const Entry& e : entries_) {
    if (e.count == kFill) {
      fill = true;
    } else {
      fixed += e.count;
    }
  }
  if (fixed > num_layers || (!fill && fixed != num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": '", ToString(), "' names ",
                                                   fixed, " layers but the model has ", num_layers,
                                                   fill ? "" : " (NAME* fills the layers left)"));
  }
  std::vector<KvDtype> out;
  out.reserve(num_layers);
  for (const Entry& e : entries_) {
    const int64_t n = e.count == kFill ? num_layers - fixed : e.count;
    out.insert(out.end(), n, e.dtype);
  }
  return out;
}

std::string KvDtypeSpec::ToString() const {
  if (is_uniform()) return std::string(KvDtypeName(entries_[0].dtype));
  std::string out;
  for (const Entry& e : entries_) {
    if (!out.empty()) out += ',';
    out += KvDtypeName(e.dtype);
    if (e.count == kFill) {
      out += '*';
    } else if (e.count > 1 || entries_.size() == 1) {  // "int8*1" is not "int8"
      absl::StrAppend(&out, "*", e.count);
    }
  }
  return out;
}

bool KvDtypeSpec::Uses(KvDtype dtype) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [dtype](const Entry& e) { return e.dtype == dtype; });
}

}  // namespace kvserve
