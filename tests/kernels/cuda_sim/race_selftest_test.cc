// The ThreadSanitizer checking mode of cuda_sim.h against a planted race:
// each thread writes its slot of shared memory and reads both neighbours'
// slots with no barrier between, so whichever order the fibers run in, one
// of each pair reads before the other writes. TSan must report it in
// forward, reverse and random fiber order, and stay silent about the same
// kernel with __syncthreads between (the simulator's own bookkeeping
// included). Each run is a fresh process (this binary running one hidden
// test case, the fiber order in CUDA_SIM_ORDER), whose exit status a TSan
// report sets; not a fork of this process: in the child of a process with
// other threads (fibers count) TSan stops tracking the forking thread.
// Without TSan (any build but make test-tsan-sim) it says so and passes.
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim.h"  // first: the shims the kernel source needs
// clang-format on

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 64;
constexpr char kRacyName[] = "cuda_sim race self-test child: no barrier";
constexpr char kFixedName[] = "cuda_sim race self-test child: a barrier";

struct NeighbourArgs {
  float* out;  // [kThreads]
  bool sync;   // __syncthreads between the write and the reads
};

// Thread t writes shared[t], then reads shared[t - 1] and shared[t + 1].
__global__ void NeighbourKernel(NeighbourArgs a) {
  float* s = static_cast<float*>(cuda_sim::g_dynamic_shared);
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  s[t] = static_cast<float>(t);
  if (a.sync) __syncthreads();
  a.out[t] = (t > 0 ? s[t - 1] : 0.0f) + (t + 1 < n ? s[t + 1] : 0.0f);
}

std::vector<float> RunNeighbours(bool sync) {
  std::vector<float> shared(kThreads), out(kThreads);
  cuda_sim::Launch(NeighbourKernel, dim3(1), kThreads, shared.data(), shared.size() * 4,
                   NeighbourArgs{out.data(), sync});
  return out;
}

// The two runs of the test below, each alone in its process.
TEST_CASE(kRacyName, "[.][cuda_sim_race_child]") { RunNeighbours(false); }
TEST_CASE(kFixedName, "[.][cuda_sim_race_child]") {
  const std::vector<float> out = RunNeighbours(true);
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(out[t] == (t > 0 ? t - 1.0f : 0.0f) + (t + 1 < kThreads ? t + 1.0f : 0.0f));
  }
}

#if defined(CUDA_SIM_TSAN)
struct Run {
  int exit_code;
  std::string err;  // its stderr
};
// This binary running test case `name` with CUDA_SIM_ORDER=order, TSan's
// exit status on a report 66.
Run RunChild(const std::string& order, const char* name) {
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const char* tsan = std::getenv("TSAN_OPTIONS");
  const std::string options = std::string(tsan == nullptr ? "" : tsan) + ":exitcode=66";
  Run r;
  r.exit_code = testing::RunShell(
      "CUDA_SIM_ORDER=" + order + " TSAN_OPTIONS=" + testing::ShellQuote(options) + " " +
          testing::ShellQuote(exe) + " " + testing::ShellQuote(name) + " 2>&1 >/dev/null",
      &r.err);
  return r;
}
#endif

TEST_CASE("ThreadSanitizer reports a shared-memory race of simulated threads in any fiber order",
          "[cuda_sim][tsan]") {
#if !defined(CUDA_SIM_TSAN)
  WARN("not a ThreadSanitizer build (make test-tsan-sim runs this one): skipped");
#else
  for (const char* order : {"forward", "reverse", "random:7"}) {
    INFO("CUDA_SIM_ORDER=" << order);
    const Run racy = RunChild(order, kRacyName);
    INFO("without the barrier, stderr:\n" << racy.err);
    CHECK(racy.exit_code == 66);
    CHECK(racy.err.find("WARNING: ThreadSanitizer: data race") != std::string::npos);
    CHECK(racy.err.find("NeighbourKernel") != std::string::npos);
    const Run fixed = RunChild(order, kFixedName);
    INFO("with the barrier, stderr:\n" << fixed.err);
    CHECK(fixed.exit_code == 0);
    CHECK(fixed.err.find("ThreadSanitizer") == std::string::npos);
  }
#endif
}

}  // namespace
}  // namespace kvserve::cuda
