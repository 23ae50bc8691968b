#include "server/cli/flags.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvserve::cli {

int CliFlags::Split(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage_, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return UsageError("unexpected argument '" + arg + "'");
    CliFlag flag;
    if (std::find(switches_.begin(), switches_.end(), arg) != switches_.end()) {
      flag.name = arg;
      flag.value = "yes";
    } else if (size_t eq = arg.find('='); eq != std::string::npos) {
      flag.name = arg.substr(0, eq);
      flag.value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      flag.name = arg;
      flag.value = argv[++i];
    } else {
      return UsageError(arg + " needs a value");
    }
    flags_.push_back(std::move(flag));
  }
  return -1;
}

int CliFlags::UsageError(const std::string& message) const {
  std::fprintf(stderr, "kvserve %s: %s\n(run 'kvserve %s --help' for usage)\n", command_.c_str(),
               message.c_str(), command_.c_str());
  return 2;
}

int CliFlags::BadValue(const CliFlag& flag, const std::string& want) const {
  return UsageError(flag.name + ": '" + flag.value + "' is not " + want);
}

bool CliFlags::ParseInt(const std::string& text, long long lo, long long hi, long long* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool CliFlags::ParseFloat(const std::string& text, float* out) {
  return absl::SimpleAtof(text, out);
}

void SetWeightDtype(const WeightQuantSpec& q, std::string* body, std::string* head,
                    int32_t* group_size) {
  *group_size = q.group_size;
  *body = std::string(WeightQuantName(q.body));
  *head = q.head_auto ? "auto" : std::string(WeightQuantName(q.head));
}

std::optional<int> ModelFlags::Take(const CliFlags& flags, const CliFlag& flag, unsigned accepted) {
  long long n = 0;
  if (flag.name == "--model" && (accepted & kModelFlag)) {
    model = flag.value;
  } else if (flag.name == "--tokenizer" && (accepted & kTokenizerFlag)) {
    tokenizer = flag.value;
  } else if (flag.name == "--kv-dtype" && (accepted & kKvDtypeFlag)) {
    absl::StatusOr<KvDtypeSpec> d = KvDtypeSpec::Parse(flag.value, "--kv-dtype");
    if (!d.ok()) return flags.UsageError(std::string(d.status().message()));
    kv_dtypes.push_back(*d);
  } else if (flag.name == "--block-size" && (accepted & kBlockSizeFlag)) {
    if (!CliFlags::ParseInt(flag.value, 1, 65536, &n)) {
      return flags.BadValue(flag, "an integer in [1, 65536]");
    }
    block_size = static_cast<int>(n);
  } else if (flag.name == "--weight-dtype" && (accepted & kWeightDtypeFlag)) {
    // "BODY[+head HEAD][/gN]" (N: the int4 group size).
    std::string body = flag.value, head = "auto";
    int group = 32;
    if (size_t g = body.find("/g"); g != std::string::npos) {
      if (!absl::SimpleAtoi(body.substr(g + 2), &group)) {
        return flags.BadValue(flag, "BODY[+head HEAD][/gN] with N the int4 group size");
      }
      body = body.substr(0, g);
    }
    if (size_t plus = body.find("+head"); plus != std::string::npos) {
      head = body.substr(plus + 5);
      body = body.substr(0, plus);
    }
    absl::StatusOr<WeightQuantSpec> q = ParseWeightQuant(body, head, group);
    if (!q.ok()) {
      return flags.UsageError(absl::StrCat("--weight-dtype: ", std::string(q.status().message())));
    }
    weight_dtype_names.push_back(flag.value);
    weight_dtypes.push_back(*q);
  } else if (flag.name == "--threads" && (accepted & kThreadsFlag)) {
    if (!CliFlags::ParseInt(flag.value, 0, 1024, &n)) {
      return flags.BadValue(flag, "an integer in [0, 1024]");
    }
    threads = static_cast<int>(n);
  } else {
    return std::nullopt;
  }
  return -1;
}

}  // namespace kvserve::cli
