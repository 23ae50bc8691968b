// Where the benchmarks find the shared reference model and data: under
// $KVSERVE_SHARED when set, else the first shared/ folder in or beside the
// current directory or one of its parents, else ../shared/ (so a missing file
// is named where it was looked for last).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvserve::bench {

inline std::string SharedFile(const std::string& rel) {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("KVSERVE_SHARED"); env != nullptr && *env != '\0') {
    return std::string(env) + "/" + rel;
  }
  for (fs::path d = fs::current_path();; d = d.parent_path()) {
    if (fs::exists(d / "shared" / rel)) return (d / "shared" / rel).string();
    if (fs::exists(d / ".." / "shared" / rel)) {
      return (d / ".." / "shared" / rel).lexically_normal().string();
    }
    if (d == d.parent_path()) break;
  }
  return "../shared/" + rel;
}

}  // namespace kvserve::bench
