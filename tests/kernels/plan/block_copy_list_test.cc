// PackStepCopies: one step's three copy batches laid out for one upload, in
// run order, with the invariants that let each batch run in parallel
// checked and named.
#include "kernels/plan/block_copy_list.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace kvserve {
namespace {

void RequireBad(const absl::StatusOr<PackedStepCopies>& packed, const std::string& what) {
  INFO(std::string(packed.status().message()));
  REQUIRE(packed.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(packed.status().message()).find(what) != std::string::npos);
}

TEST_CASE("PackStepCopies lays out swap_out, copies, swap_in", "[kernels][block_copy]") {
  StepCopies step;
  step.swap_out = {{3, 0}, {4, 1}};
  step.copies = {{5, 6}};
  step.swap_in = {{2, 7}, {0, 3}, {1, 4}};
  const absl::StatusOr<PackedStepCopies> packed = PackStepCopies(step, 8, 4);
  REQUIRE(packed.ok());
  REQUIRE(packed->pairs == std::vector<BlockCopy>{{3, 0}, {4, 1}, {5, 6}, {2, 7}, {0, 3}, {1, 4}});
  REQUIRE(packed->swap_out_begin == 0);
  REQUIRE(packed->num_swap_out == 2);
  REQUIRE(packed->copies_begin == 2);
  REQUIRE(packed->num_copies == 1);
  REQUIRE(packed->swap_in_begin == 3);
  REQUIRE(packed->num_swap_in == 3);
  // The device reads the pairs as [n][2] int32.
  const int32_t* raw = reinterpret_cast<const int32_t*>(packed->pairs.data());
  REQUIRE(raw[4] == 5);
  REQUIRE(raw[5] == 6);

  const absl::StatusOr<PackedStepCopies> empty = PackStepCopies(StepCopies{}, 8, 0);
  REQUIRE(empty.ok());
  REQUIRE(empty->pairs.empty());
}

TEST_CASE("PackStepCopies rejects what a parallel batch cannot run", "[kernels][block_copy]") {
  StepCopies step;
  SECTION("ids outside their pool, per direction") {
    step.swap_out = {{8, 0}};
    RequireBad(PackStepCopies(step, 8, 4), "swap_out[0]");
    step.swap_out = {{7, 4}};
    RequireBad(PackStepCopies(step, 8, 4), "swap_out[0]");
    step.swap_out = {};
    step.swap_in = {{0, 1}, {4, 2}};
    RequireBad(PackStepCopies(step, 8, 4), "swap_in[1]");
    step.swap_in = {};
    step.copies = {{-1, 2}};
    RequireBad(PackStepCopies(step, 8, 4), "copies[0]");
  }
  SECTION("a block written twice in one batch") {
    step.copies = {{1, 2}, {3, 2}};
    RequireBad(PackStepCopies(step, 8, 4), "block 2 is the destination of two copies");
  }
  SECTION("a copy-on-write destination that is also a source") {
    step.copies = {{1, 2}, {2, 3}};
    RequireBad(PackStepCopies(step, 8, 4), "block 2 is both a destination and a source");
  }
  SECTION("the same id on both sides of a swap is fine (different pools)") {
    step.swap_out = {{1, 1}, {2, 2}};
    REQUIRE(PackStepCopies(step, 8, 4).ok());
  }
}

}  // namespace
}  // namespace kvserve
