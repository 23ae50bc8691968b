// Batch invariance of the CUDA runner on a device: the stand-in's test
// (tests/cuda_stub/cuda_batch_invariance_stub_test.cc) with the same body,
// where the real cuBLASLt and the device's kernels run.
#include <catch2/catch.hpp>

#include "tests/model/cuda/batch_invariance.h"

namespace kvserve {
namespace {

TEST_CASE("[gpu] a row's logits are the same bits alone, in a batch of 7, in a graph", "[gpu]") {
  for (const char* kv : {"fp32", "bf16", "int8", "int4", "int4_kc"}) {
    DYNAMIC_SECTION("kv " << kv) { testing::CheckBatchInvariance(kv); }
  }
}

}  // namespace
}  // namespace kvserve
