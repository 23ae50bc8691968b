// Batch invariance of the CUDA runner through the stand-in (the body, and
// why it holds on a device: tests/model/cuda/batch_invariance.h).
#include <catch2/catch.hpp>

#include "tests/model/cuda/batch_invariance.h"

namespace kvserve {
namespace {

TEST_CASE("stub runner: a row's logits are the same bits alone, in a batch of 7, in a graph",
          "[cuda_stub]") {
  for (const char* kv : {"fp32", "int8", "int4_kc"}) {
    DYNAMIC_SECTION("kv " << kv) { testing::CheckBatchInvariance(kv); }
  }
}

}  // namespace
}  // namespace kvserve
