#include "model/graph_buckets.h"

#include <catch2/catch.hpp>
#include <vector>

namespace kvserve {
namespace {

TEST_CASE("Graph buckets: 1, 2, 4, then multiples of 8, and max_num_seqs last", "[model]") {
  REQUIRE(GraphBatchBuckets(0).empty());
  REQUIRE(GraphBatchBuckets(1) == std::vector<int32_t>{1});
  REQUIRE(GraphBatchBuckets(3) == std::vector<int32_t>{1, 2, 3});
  REQUIRE(GraphBatchBuckets(8) == std::vector<int32_t>{1, 2, 4, 8});
  REQUIRE(GraphBatchBuckets(20) == std::vector<int32_t>{1, 2, 4, 8, 16, 20});
  REQUIRE(GraphBatchBuckets(32) == std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32});
  const std::vector<int32_t> b256 = GraphBatchBuckets(256);
  REQUIRE(b256.size() == 3 + 32);
  REQUIRE(b256[3] == 8);
  REQUIRE(b256.back() == 256);
}

TEST_CASE("A decode step replays the smallest bucket that holds it", "[model]") {
  const std::vector<int32_t> b = GraphBatchBuckets(20);
  REQUIRE(GraphBucketFor(b, 0) == 0);
  REQUIRE(GraphBucketFor(b, 1) == 1);
  REQUIRE(GraphBucketFor(b, 3) == 4);
  REQUIRE(GraphBucketFor(b, 8) == 8);
  REQUIRE(GraphBucketFor(b, 9) == 16);
  REQUIRE(GraphBucketFor(b, 17) == 20);
  REQUIRE(GraphBucketFor(b, 21) == 0);  // larger than every bucket: eager
  REQUIRE(GraphBucketFor({}, 1) == 0);  // graphs off
}

TEST_CASE("A bucket's graph splits long contexts more finely the smaller the batch", "[model]") {
  REQUIRE(GraphPartitionKeys(1) == 256);
  REQUIRE(GraphPartitionKeys(8) == 256);
  REQUIRE(GraphPartitionKeys(16) == 512);
  REQUIRE(GraphPartitionKeys(32) == 512);
  REQUIRE(GraphPartitionKeys(40) == 1024);
  REQUIRE(GraphPartitionKeys(256) == 1024);
}

}  // namespace
}  // namespace kvserve
