#include "model/cuda/host/graph_buckets.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "kernels/batch_input.h"
#include "kernels/paged_view.h"
#include "model/cuda/host/batch_staging.h"

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

TEST_CASE("Every bucket's graph splits long contexts at the same 512 keys", "[model]") {
  // Batch invariance: a row's attention partitions do not depend on the
  // bucket it is replayed in (nor on the eager batch, cuda_runner_create.cc).
  for (int32_t bucket : {1, 8, 16, 32, 40, 256}) REQUIRE(GraphPartitionKeys(bucket) == 512);
}

// A pure decode step of `batch` sequences with the given contexts.
BatchInput Decode(const std::vector<int32_t>& contexts, int block_size) {
  BatchInput b;
  b.Clear();
  int32_t width = 0;
  for (int32_t c : contexts) width = std::max(width, (c + block_size - 1) / block_size);
  b.max_blocks_per_seq = width;
  int32_t next = 0;
  for (size_t s = 0; s < contexts.size(); ++s) {
    const int32_t c = contexts[s];
    b.token_ids.push_back(1);
    b.positions.push_back(c - 1);
    std::vector<int32_t> row(width, 0);
    for (int32_t i = 0; i < (c + block_size - 1) / block_size; ++i) row[i] = next++;
    b.slot_mapping.push_back(int64_t{row[(c - 1) / block_size]} * block_size +
                             (c - 1) % block_size);
    b.query_start.push_back(static_cast<int32_t>(s) + 1);
    b.context_len.push_back(c);
    b.block_table.insert(b.block_table.end(), row.begin(), row.end());
    b.logits_rows.push_back(static_cast<int32_t>(s));
  }
  return b;
}

TEST_CASE("A graph's attention capacities hold every decode step of its bucket", "[model]") {
  // stories260K's shape and Llama-3-8B's.
  for (const GpuAttentionShape shape :
       {GpuAttentionShape{8, 4, 8, 0}, GpuAttentionShape{32, 8, 128, 0},
        GpuAttentionShape{32, 8, 128, 4096}}) {
    for (const int64_t max_context : {int64_t{512}, int64_t{8192}}) {
      GpuAttentionPlanOptions base;
      base.num_sms = 132;
      std::mt19937 rng(static_cast<uint32_t>(max_context + shape.head_dim));
      for (int32_t bucket : GraphBatchBuckets(64)) {
        const GraphAttention g = GraphAttentionFor(shape, base, bucket, max_context);
        INFO("heads " << shape.num_heads << " window " << shape.sliding_window << " context "
                      << max_context << " bucket " << bucket);
        REQUIRE(g.options.fixed_partition_keys == GraphPartitionKeys(bucket));
        REQUIRE(g.launch.heads_per_cta ==
                GpuAttentionHeadsPerCta(shape.num_heads, shape.num_kv_heads));
        REQUIRE((g.launch.num_partials == 0) == (max_context <= g.options.fixed_partition_keys));
        if (g.launch.num_partials == 0) REQUIRE(g.launch.num_merges == 0);
        for (int trial = 0; trial < 8; ++trial) {
          // Full buckets at the longest context, and random smaller ones.
          const int32_t batch = trial == 0 ? bucket : 1 + static_cast<int32_t>(rng() % bucket);
          std::vector<int32_t> contexts(batch);
          for (int32_t& c : contexts) {
            c = trial == 0 ? static_cast<int32_t>(max_context)
                           : 1 + static_cast<int32_t>(rng() % max_context);
          }
          const BatchInput b = Decode(contexts, 16);
          absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(b), shape, g.options);
          REQUIRE(plan.ok());
          REQUIRE(plan->launch().num_items <= g.launch.num_items);
          REQUIRE(plan->launch().num_merges <= g.launch.num_merges);
          REQUIRE(plan->launch().num_partials <= g.launch.num_partials);
          REQUIRE(plan->launch().heads_per_cta == g.launch.heads_per_cta);
          REQUIRE(static_cast<int64_t>(plan->words().size()) <= g.max_words);
          REQUIRE(GpuAttentionWorkspaceBytes(shape, plan->launch().num_partials) <=
                  g.workspace_bytes);
          // And it stages into the bucket's padded layout.
          const StagingLayout layout =
              PlanStaging(PaddedDecodeShape(bucket, static_cast<int32_t>((max_context + 15) / 16),
                                            static_cast<int32_t>(g.max_words)));
          std::vector<uint8_t> buf(layout.total_bytes);
          REQUIRE(FillBatchStaging(b, plan->words(), layout, buf).ok());
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve
