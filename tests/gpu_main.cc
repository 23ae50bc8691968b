// Entry point of the [gpu] tests: they compare each CUDA kernel with the CPU
// reference. Without a device (unless asked to list the cases) the binary says so and exits 77,
// which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  // Listing needs no device (gpu-bundle/run.sh lists the cases to rerun
  // each in a process of its own).
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  int count = 0;
  if (!listing && (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)) {
    std::printf("gpu_tests: skipped, no CUDA device\n");
    return 77;
  }
  const int rc = Catch::Session().run(argc, argv);
  return listing ? 0 : rc;  // Catch2 returns the number of cases listed
}
