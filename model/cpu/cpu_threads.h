// How many threads the CPU forward pass may usefully run: the CPUs this
// process can actually get, not the host's core count. In a container with a
// CPU limit (Kubernetes `resources.limits.cpu`, docker --cpus) or a cpuset
// (taskset, docker --cpuset-cpus), a pool sized from
// std::thread::hardware_concurrency() oversubscribes the quota: the kernel
// throttles the whole cgroup for the rest of each period, and a fork-join
// phase waits for a worker that is not allowed to run.
//
// The answer is min(hardware threads, CPUs in the affinity mask, the cgroup's
// CPU quota rounded up), at least 1. The quota comes from cgroup v2
// (`cpu.max`: "<quota> <period>" or "max <period>") or, on cgroup v1 hosts,
// `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: no limit). A fractional
// quota rounds up (1.5 CPUs -> 2 threads), as Go's GOMAXPROCS and the JVM
// do: one thread fewer would leave the half CPU idle.
//
// The parsers are plain functions of the files' text so they can be tested
// without a cgroup; DefaultCpuThreads() reads the real files.
//
// Thread-safety: free functions; DefaultCpuThreads reads /proc and /sys.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvserve {

// CPUs granted by a cgroup v2 `cpu.max` text ("150000 100000" -> 1.5);
// nullopt for "max ..." (no limit) or text that does not parse.
std::optional<double> ParseCgroupV2CpuMax(std::string_view text);

// CPUs granted by cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`
// texts; nullopt when the quota is -1 (no limit) or either does not parse.
std::optional<double> ParseCgroupV1CpuQuota(std::string_view quota_text,
                                            std::string_view period_text);

// The cgroup v2 path of this process from /proc/self/cgroup text (the
// "0::<path>" line), "" when there is none.
std::string CgroupV2Path(std::string_view proc_self_cgroup);

// min(hardware, affinity, ceil(quota)), at least 1; a value <= 0 (unknown)
// and a missing quota are ignored.
int CpuThreadsAllowed(int hardware_threads, int affinity_cpus, std::optional<double> quota_cpus);

// The CPU limit this process lives under, read from the cgroup files
// (v2: the process's own cgroup, then /sys/fs/cgroup; v1:
// /sys/fs/cgroup/cpu[,cpuacct]); nullopt when there is none.
std::optional<double> ReadCgroupCpuQuota();

// What model.threads = 0 means: CpuThreadsAllowed() of this machine and
// process (hardware_concurrency, sched_getaffinity, ReadCgroupCpuQuota).
int DefaultCpuThreads();

}  // namespace kvserve
