#include "model/cpu/cpu_threads.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace kvserve {
namespace {

// A whole file, or nullopt when it cannot be read.
std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

}  // namespace

std::optional<double> ParseCgroupV2CpuMax(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string quota_text, period_text, extra;
  if (!(in >> quota_text >> period_text) || (in >> extra) || quota_text == "max") {
    return std::nullopt;
  }
  return ParseCgroupV1CpuQuota(quota_text, period_text);
}

std::optional<double> ParseCgroupV1CpuQuota(std::string_view quota_text,
                                            std::string_view period_text) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(
          absl::StripAsciiWhitespace(absl::string_view(quota_text.data(), quota_text.size())),
          &quota) ||
      !absl::SimpleAtoi(
          absl::StripAsciiWhitespace(absl::string_view(period_text.data(), period_text.size())),
          &period) ||
      quota <= 0 || period <= 0) {
    return std::nullopt;
  }
  return static_cast<double>(quota) / static_cast<double>(period);
}

std::string CgroupV2Path(std::string_view proc_self_cgroup) {
  std::istringstream in{std::string(proc_self_cgroup)};
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("0::")) {
      return std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(3)));
    }
  }
  return "";
}

int CpuThreadsAllowed(int hardware_threads, int affinity_cpus, std::optional<double> quota_cpus) {
  int n = hardware_threads > 0 ? hardware_threads : std::numeric_limits<int>::max();
  if (affinity_cpus > 0) n = std::min(n, affinity_cpus);
  if (quota_cpus.has_value() && *quota_cpus > 0) {
    // A hair of tolerance so 2.0000001 (a quota not divisible by the period)
    // stays 2.
    n = std::min(n, static_cast<int>(std::ceil(*quota_cpus - 1e-6)));
  }
  return n == std::numeric_limits<int>::max() ? 1 : std::max(n, 1);
}

std::optional<double> ReadCgroupCpuQuota() {
  // cgroup v2: the limit of our own cgroup (inside a container whose
  // namespace root is its cgroup, that is /sys/fs/cgroup itself). Limits of
  // ancestors are not walked: container runtimes set them on the leaf.
  std::vector<std::string> v2_files;
  if (std::optional<std::string> self = ReadSmallFile("/proc/self/cgroup")) {
    std::string path = CgroupV2Path(*self);
    if (!path.empty() && path != "/") v2_files.push_back("/sys/fs/cgroup" + path + "/cpu.max");
  }
  v2_files.push_back("/sys/fs/cgroup/cpu.max");
  for (const std::string& f : v2_files) {
    if (std::optional<std::string> text = ReadSmallFile(f)) return ParseCgroupV2CpuMax(*text);
  }
  // cgroup v1.
  for (const char* dir : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    std::optional<std::string> quota = ReadSmallFile(std::string(dir) + "/cpu.cfs_quota_us");
    std::optional<std::string> period = ReadSmallFile(std::string(dir) + "/cpu.cfs_period_us");
    if (quota && period) return ParseCgroupV1CpuQuota(*quota, *period);
  }
  return std::nullopt;
}

int DefaultCpuThreads() {
  return CpuThreadsAllowed(static_cast<int>(std::thread::hardware_concurrency()), AffinityCpus(),
                           ReadCgroupCpuQuota());
}

}  // namespace kvserve
