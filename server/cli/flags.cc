#include "server/cli/flags.h"

#include <cstdio>

#include "absl/strings/numbers.h"

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
    if (size_t eq = arg.find('='); eq != std::string::npos) {
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

}  // namespace kvserve::cli
