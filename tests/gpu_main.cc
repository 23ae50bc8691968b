// Entry point of the [gpu] tests: they compare each CUDA kernel with the CPU
// reference. Without a device the binary says so and exits 77, which ctest
// reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("gpu_tests: skipped, no CUDA device\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
