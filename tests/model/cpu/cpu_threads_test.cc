#include "model/cpu/cpu_threads.h"

#include <catch2/catch.hpp>
#include <thread>

namespace kvserve {
namespace {

TEST_CASE("cgroup v2 cpu.max gives the CPUs of the quota", "[model]") {
  REQUIRE(ParseCgroupV2CpuMax("200000 100000\n") == 2.0);
  REQUIRE(ParseCgroupV2CpuMax("150000 100000") == 1.5);
  REQUIRE(ParseCgroupV2CpuMax("50000 100000\n") == 0.5);
  SECTION("no limit, or text that is not a quota") {
    REQUIRE_FALSE(ParseCgroupV2CpuMax("max 100000\n").has_value());
    REQUIRE_FALSE(ParseCgroupV2CpuMax("").has_value());
    REQUIRE_FALSE(ParseCgroupV2CpuMax("100000").has_value());
    REQUIRE_FALSE(ParseCgroupV2CpuMax("abc 100000").has_value());
    REQUIRE_FALSE(ParseCgroupV2CpuMax("100000 0").has_value());
    REQUIRE_FALSE(ParseCgroupV2CpuMax("-1 100000").has_value());
  }
}

TEST_CASE("cgroup v1 cfs quota and period give the CPUs of the quota", "[model]") {
  REQUIRE(ParseCgroupV1CpuQuota("300000\n", "100000\n") == 3.0);
  REQUIRE(ParseCgroupV1CpuQuota("25000", "100000") == 0.25);
  REQUIRE_FALSE(ParseCgroupV1CpuQuota("-1\n", "100000\n").has_value());
  REQUIRE_FALSE(ParseCgroupV1CpuQuota("x", "100000").has_value());
  REQUIRE_FALSE(ParseCgroupV1CpuQuota("100000", "").has_value());
}

TEST_CASE("The process's cgroup v2 path comes from the 0:: line", "[model]") {
  REQUIRE(CgroupV2Path("0::/kubepods/pod1/abc\n") == "/kubepods/pod1/abc");
  REQUIRE(CgroupV2Path("4:memory:/x\n1:cpu:/\n0::/\n") == "/");
  REQUIRE(CgroupV2Path("4:memory:/x\n1:cpu:/y\n").empty());
}

TEST_CASE("Threads are the least of hardware, affinity and the rounded-up quota", "[model]") {
  REQUIRE(CpuThreadsAllowed(64, 64, std::nullopt) == 64);
  REQUIRE(CpuThreadsAllowed(64, 8, std::nullopt) == 8);
  REQUIRE(CpuThreadsAllowed(64, 64, 4.0) == 4);
  REQUIRE(CpuThreadsAllowed(64, 64, 1.5) == 2);
  REQUIRE(CpuThreadsAllowed(64, 3, 6.0) == 3);
  REQUIRE(CpuThreadsAllowed(2, 64, 6.0) == 2);
  REQUIRE(CpuThreadsAllowed(64, 64, 2.0000001) == 2);
  SECTION("at least one thread; unknown values are ignored") {
    REQUIRE(CpuThreadsAllowed(64, 64, 0.1) == 1);
    REQUIRE(CpuThreadsAllowed(0, 0, std::nullopt) == 1);
    REQUIRE(CpuThreadsAllowed(0, 4, std::nullopt) == 4);  // hardware unknown
    REQUIRE(CpuThreadsAllowed(8, 0, 0.0) == 8);
  }
}

TEST_CASE("DefaultCpuThreads is within what the machine has", "[model]") {
  const int n = DefaultCpuThreads();
  REQUIRE(n >= 1);
  REQUIRE(n <= static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace kvserve
