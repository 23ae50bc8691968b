#include "server/config/config_values.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/byte_size.h"
#include "util/status_macros.h"

namespace kvserve::config_values {

absl::Status Bad(const std::string& key, const std::string& expected, const std::string& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": expected ", expected, ", got '", got, "'"));
}

// ${VAR} and ${VAR:-fallback}; the fallback may itself hold ${...}.
absl::StatusOr<std::string> ExpandEnv(const std::string& key, const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 2, "${") != 0) {
      out.push_back(text[i++]);
      continue;
    }
    // Find the matching brace, allowing nested ${...} in the fallback.
    size_t depth = 1, j = i + 2;
    for (; j < text.size() && depth > 0; ++j) {
      if (text.compare(j, 2, "${") == 0) {
        ++depth;
        ++j;
      } else if (text[j] == '}') {
        --depth;
      }
    }
    if (depth != 0) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": unterminated ${ in '", text, "'"));
    }
    std::string inner = text.substr(i + 2, j - 1 - (i + 2));
    std::string name = inner, fallback;
    bool has_fallback = false;
    if (size_t sep = inner.find(":-"); sep != std::string::npos) {
      name = inner.substr(0, sep);
      fallback = inner.substr(sep + 2);
      has_fallback = true;
    }
    const char* value = std::getenv(name.c_str());
    if (value != nullptr && *value != '\0') {
      out.append(value);
    } else if (has_fallback) {
      KV_ASSIGN_OR_RETURN(std::string expanded, ExpandEnv(key, fallback));
      out.append(expanded);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(key, ": environment variable ", name,
                                                     " is not set (use ${", name, ":-fallback})"));
    }
    i = j;
  }
  return out;
}

absl::StatusOr<int64_t> ParseInt(const std::string& key, const std::string& text, int64_t min,
                                 int64_t max, const std::string& expected) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v) || v < min || v > max) {
    return Bad(key, expected, text);
  }
  return v;
}

absl::StatusOr<double> ParseDouble(const std::string& key, const std::string& text,
                                   const std::string& expected) {
  double v = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &v) || !std::isfinite(v)) {
    return Bad(key, expected, text);
  }
  return v;
}

absl::StatusOr<bool> ParseBool(const std::string& key, const std::string& text) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  return Bad(key, "true or false", text);
}

// A plain count is bytes; units as util/byte_size.h's ParseByteSize.
absl::StatusOr<int64_t> ParseBytes(const std::string& key, const std::string& text) {
  return ParseByteSize(text, key);
}

// Seconds as a number, optionally with an "s", "ms" or "m" suffix.
absl::StatusOr<double> ParseSeconds(const std::string& key, const std::string& text) {
  const std::string expected = "a duration in seconds >= 0 (e.g. 30, 2.5s, 500ms, 1m)";
  std::string t(absl::StripAsciiWhitespace(text));
  double scale = 1;
  if (t.size() > 2 && t.ends_with("ms")) {
    scale = 1e-3;
    t.resize(t.size() - 2);
  } else if (t.size() > 1 && t.back() == 's') {
    t.pop_back();
  } else if (t.size() > 1 && t.back() == 'm') {
    scale = 60;
    t.pop_back();
  }
  absl::StatusOr<double> v = ParseDouble(key, t, expected);
  if (!v.ok() || *v < 0) return Bad(key, expected, text);
  return *v * scale;
}

absl::StatusOr<std::string> ParseEnum(const std::string& key, const std::string& text,
                                      const std::vector<std::string>& allowed) {
  std::string t(absl::StripAsciiWhitespace(text));
  if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) {
    return Bad(key, absl::StrCat("one of ", absl::StrJoin(allowed, ", ")), text);
  }
  return t;
}

}  // namespace kvserve::config_values
