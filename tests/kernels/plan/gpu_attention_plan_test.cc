#include "kernels/plan/gpu_attention_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/batch_input.h"
#include "kernels/paged_view.h"

namespace kvserve {

// In kvserve itself, where argument-dependent lookup finds them.
using Item = GpuAttentionWorkItem;
using Merge = GpuAttentionMergeItem;

bool operator==(const Item& a, const Item& b) {
  return a.seq == b.seq && a.row_begin == b.row_begin && a.num_rows == b.num_rows &&
         a.key_begin == b.key_begin && a.key_end == b.key_end && a.partial == b.partial;
}
bool operator==(const Merge& a, const Merge& b) {
  return a.row == b.row && a.first_partial == b.first_partial && a.num_partials == b.num_partials &&
         a.stride == b.stride;
}
std::ostream& operator<<(std::ostream& os, const Item& i) {
  return os << "{seq " << i.seq << " rows " << i.row_begin << "+" << i.num_rows << " keys ["
            << i.key_begin << "," << i.key_end << ") partial " << i.partial << "}";
}
std::ostream& operator<<(std::ostream& os, const Merge& m) {
  return os << "{row " << m.row << " first " << m.first_partial << " n " << m.num_partials
            << " stride " << m.stride << "}";
}

namespace {

Item It(int32_t seq, int32_t row, int32_t rows, int32_t kb, int32_t ke, int32_t partial) {
  Item i;
  i.seq = seq;
  i.row_begin = row;
  i.num_rows = rows;
  i.key_begin = kb;
  i.key_end = ke;
  i.partial = partial;
  return i;
}

// Three sequences with rows: a 5-row prefill chunk after a 3-token prefix
// (cache indices 3..7), one decode row at index 9, a sequence with no rows,
// and a 2-row prompt (indices 0..1). Same batch as attention_plan_test.
BatchInput MixedBatch() {
  BatchInput b;
  b.Clear();
  b.query_start = {0, 5, 6, 6, 8};
  b.context_len = {8, 10, 4, 2};
  b.max_blocks_per_seq = 3;
  b.block_table = {7, 2, -1, 4, 0, 9, 5, -1, -1, 1, -1, -1};
  b.token_ids.assign(8, 0);
  b.positions = {3, 4, 5, 6, 7, 9, 0, 1};
  b.slot_mapping.assign(8, 0);
  return b;
}

// 8 query heads over 2 kv heads: groups of 4, so tiles of 4 rows, grid y 2.
GpuAttentionShape Shape(int32_t window = 0) { return {8, 2, 64, window}; }

GpuAttentionPlanOptions NoSplit() {
  GpuAttentionPlanOptions o;
  o.split = false;
  return o;
}

GpuAttentionPlanOptions Fixed(int32_t keys) {
  GpuAttentionPlanOptions o;
  o.fixed_partition_keys = keys;
  return o;
}

GpuAttentionPlan PlanOk(const BatchInput& batch, const GpuAttentionShape& shape,
                        const GpuAttentionPlanOptions& options) {
  absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(batch), shape, options);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  return *std::move(plan);
}

// Every row's items cover exactly its tile's keys, once, in partitions that
// agree with its merge item; the upload image repeats the vectors.
void CheckInvariants(const BatchInput& batch, const GpuAttentionShape& shape,
                     const GpuAttentionPlan& plan) {
  const BatchView v = ViewOf(batch);
  const GpuAttentionPlanHeader& h = plan.header();
  REQUIRE(h.num_items == static_cast<int32_t>(plan.items().size()));
  REQUIRE(h.num_merges == static_cast<int32_t>(plan.merges().size()));
  REQUIRE(h.heads_per_cta == GpuAttentionHeadsPerCta(shape.num_heads, shape.num_kv_heads));
  REQUIRE(shape.num_heads % h.heads_per_cta == 0);
  REQUIRE(h.heads_per_cta * h.rows_per_tile <= kGpuAttentionMaxQueryVectors);
  // The image.
  REQUIRE(plan.words().size() == 8u + 8u * h.num_items + 4u * h.num_merges);
  REQUIRE(std::memcmp(plan.words().data(), &h, sizeof(h)) == 0);
  REQUIRE(h.items_offset == 8);
  REQUIRE(h.merges_offset == 8 + 8 * h.num_items);
  for (int32_t i = 0; i < h.num_items; ++i) {
    REQUIRE(std::memcmp(plan.words().data() + h.items_offset + 8 * i, &plan.items()[i],
                        sizeof(Item)) == 0);
  }
  for (int32_t i = 0; i < h.num_merges; ++i) {
    REQUIRE(std::memcmp(plan.words().data() + h.merges_offset + 4 * i, &plan.merges()[i],
                        sizeof(Merge)) == 0);
  }
  // Heaviest first.
  for (size_t i = 1; i < plan.items().size(); ++i) {
    const Item& a = plan.items()[i - 1];
    const Item& b = plan.items()[i];
    REQUIRE(int64_t(a.key_end - a.key_begin) * a.num_rows >=
            int64_t(b.key_end - b.key_begin) * b.num_rows);
  }
  std::vector<int> slot_uses(h.num_partials, 0);
  for (int32_t r = 0; r < v.num_tokens; ++r) {
    INFO("row " << r);
    const int32_t s = v.SeqOfRow(r);
    std::vector<Item> mine;
    for (const Item& it : plan.items()) {
      if (it.row_begin <= r && r < it.row_begin + it.num_rows) mine.push_back(it);
    }
    REQUIRE(!mine.empty());
    std::sort(mine.begin(), mine.end(),
              [](const Item& a, const Item& b) { return a.key_begin < b.key_begin; });
    const Item& first = mine.front();
    REQUIRE(first.seq == s);
    REQUIRE(first.num_rows <= h.rows_per_tile);
    // The tile's keys: from the first row's window start to the last row.
    REQUIRE(first.key_begin == KeyBegin(v.CacheIndex(s, first.row_begin), shape.sliding_window));
    REQUIRE(mine.back().key_end == v.CacheIndex(s, first.row_begin + first.num_rows - 1) + 1);
    for (size_t p = 1; p < mine.size(); ++p) {
      REQUIRE(mine[p].key_begin == mine[p - 1].key_end);
      REQUIRE(mine[p].row_begin == first.row_begin);
      REQUIRE(mine[p].num_rows == first.num_rows);
    }
    const auto merge = std::find_if(plan.merges().begin(), plan.merges().end(),
                                    [r](const Merge& m) { return m.row == r; });
    if (mine.size() == 1) {
      REQUIRE(first.partial == -1);
      REQUIRE(merge == plan.merges().end());
      continue;
    }
    REQUIRE(merge != plan.merges().end());
    REQUIRE(merge->num_partials == static_cast<int32_t>(mine.size()));
    for (size_t p = 0; p < mine.size(); ++p) {
      REQUIRE(mine[p].key_end > mine[p].key_begin);
      if (h.partition_keys > 0 && p + 1 < mine.size()) {
        REQUIRE(mine[p].key_end % h.partition_keys == 0);
      }
      const int32_t slot = mine[p].partial + (r - first.row_begin);
      REQUIRE(slot == merge->first_partial + static_cast<int32_t>(p) * merge->stride);
      REQUIRE(slot >= 0);
      REQUIRE(slot < h.num_partials);
      ++slot_uses[slot];
    }
  }
  for (int uses : slot_uses) REQUIRE(uses == 1);
  for (size_t i = 1; i < plan.merges().size(); ++i) {
    REQUIRE(plan.merges()[i - 1].row < plan.merges()[i].row);
  }
}

TEST_CASE("GPU attention plan: heads per CTA and rows per tile", "[kernels][gpu_plan]") {
  REQUIRE(GpuAttentionHeadsPerCta(8, 8) == 1);
  REQUIRE(GpuAttentionHeadsPerCta(32, 8) == 4);
  REQUIRE(GpuAttentionHeadsPerCta(16, 2) == 8);
  REQUIRE(GpuAttentionHeadsPerCta(6, 1) == 6);
  REQUIRE(GpuAttentionHeadsPerCta(32, 1) == 16);  // MQA: two CTAs per kv head
  REQUIRE(GpuAttentionHeadsPerCta(34, 2) == 1);   // group 17: no divisor <= 16 but 1
  REQUIRE(GpuAttentionHeadsPerCta(36, 1) == 12);
  REQUIRE(GpuAttentionHeadsPerCta(8, 3) == 0);  // not a multiple
  BatchInput batch = MixedBatch();
  struct {
    int32_t heads, kv, hpc, rows;
  } cases[] = {{2, 2, 1, 16}, {8, 2, 4, 4}, {16, 2, 8, 2}, {6, 2, 3, 5}, {32, 1, 16, 1}};
  for (const auto& c : cases) {
    const GpuAttentionPlan plan = PlanOk(batch, {c.heads, c.kv, 8, 0}, NoSplit());
    REQUIRE(plan.header().heads_per_cta == c.hpc);
    REQUIRE(plan.header().rows_per_tile == c.rows);
  }
}

TEST_CASE("GPU attention plan: exact work lists for a mixed batch", "[kernels][gpu_plan]") {
  BatchInput batch = MixedBatch();

  SECTION("unsplit: one item per tile of up to 4 rows, heaviest first") {
    const GpuAttentionPlan plan = PlanOk(batch, Shape(), NoSplit());
    // Tiles: rows 0-3 (indices 3..6, 7 keys x 4 rows), row 4 (8 keys),
    // row 5 (10 keys), rows 6-7 (2 keys x 2 rows).
    REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 4, 0, 7, -1), It(1, 5, 1, 0, 10, -1),
                                              It(0, 4, 1, 0, 8, -1), It(3, 6, 2, 0, 2, -1)});
    REQUIRE(plan.merges().empty());
    REQUIRE(plan.header().num_partials == 0);
    REQUIRE(plan.header().partition_keys == 0);
    REQUIRE(plan.words().size() == 8 + 4 * 8);
    CheckInvariants(batch, Shape(), plan);
  }

  SECTION("sliding window 3: a tile's keys start at its first row's window") {
    const GpuAttentionPlan plan = PlanOk(batch, Shape(3), NoSplit());
    REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 4, 1, 7, -1), It(3, 6, 2, 0, 2, -1),
                                              It(0, 4, 1, 5, 8, -1), It(1, 5, 1, 7, 10, -1)});
    CheckInvariants(batch, Shape(3), plan);
  }

  SECTION("fixed split at 4 keys: partitions cut at multiples of 4, slots per row") {
    const GpuAttentionPlan plan = PlanOk(batch, Shape(), Fixed(4));
    // Tile rows 0-3 [0,7): slots 0..3 then 4..7; row 4 [0,8): 8, 9;
    // row 5 [0,10): 10, 11, 12; rows 6-7 [0,2) stay whole.
    REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 4, 0, 4, 0), It(0, 0, 4, 4, 7, 4),
                                              It(0, 4, 1, 0, 4, 8), It(0, 4, 1, 4, 8, 9),
                                              It(1, 5, 1, 0, 4, 10), It(1, 5, 1, 4, 8, 11),
                                              It(3, 6, 2, 0, 2, -1), It(1, 5, 1, 8, 10, 12)});
    REQUIRE(
        plan.merges() ==
        std::vector<Merge>{
            {0, 0, 2, 4}, {1, 1, 2, 4}, {2, 2, 2, 4}, {3, 3, 2, 4}, {4, 8, 2, 1}, {5, 10, 3, 1}});
    REQUIRE(plan.header().num_partials == 13);
    REQUIRE(plan.header().partition_keys == 4);
    REQUIRE(plan.launch().num_items == 8);
    REQUIRE(plan.launch().num_merges == 6);
    REQUIRE(plan.launch().heads_per_cta == 4);
    REQUIRE(plan.words().size() == 8 + 8 * 8 + 4 * 6);
    CheckInvariants(batch, Shape(), plan);
    // 13 slots of 8 heads x (max, sum, 64 accumulators).
    REQUIRE(GpuAttentionSlotFloats(Shape()) == 8 * 66);
    REQUIRE(GpuAttentionWorkspaceBytes(Shape(), 13) == 13 * 8 * 66 * 4);
    REQUIRE(GpuAttentionWorkspaceBytes(Shape(), 0) == 0);
  }

  SECTION("fixed split with a window: only tiles that straddle a cut are split") {
    const GpuAttentionPlan plan = PlanOk(batch, Shape(3), Fixed(4));
    REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 4, 1, 4, 0), It(0, 0, 4, 4, 7, 4),
                                              It(3, 6, 2, 0, 2, -1), It(0, 4, 1, 5, 8, -1),
                                              It(1, 5, 1, 8, 10, 9), It(1, 5, 1, 7, 8, 8)});
    REQUIRE(
        plan.merges() ==
        std::vector<Merge>{{0, 0, 2, 4}, {1, 1, 2, 4}, {2, 2, 2, 4}, {3, 3, 2, 4}, {5, 8, 2, 1}});
    CheckInvariants(batch, Shape(3), plan);
  }

  SECTION("auto: no split when the tiles already fill the target") {
    GpuAttentionPlanOptions o;
    o.num_sms = 4;
    o.ctas_per_sm = 2;  // target 8 CTAs = 4 tiles x 2 head chunks
    o.partition_granule = 4;
    const GpuAttentionPlan plan = PlanOk(batch, Shape(), o);
    REQUIRE(plan.header().num_items == 4);
    REQUIRE(plan.header().partition_keys == 0);
    CheckInvariants(batch, Shape(), plan);
  }

  SECTION("auto: the smallest granule multiple whose CTAs fit the target") {
    GpuAttentionPlanOptions o;
    o.num_sms = 8;
    o.ctas_per_sm = 2;  // target 16 CTAs, 8 items
    o.partition_granule = 4;
    // C = 4 gives 2 + 2 + 3 + 1 = 8 items: it fits, the same plan as Fixed(4).
    GpuAttentionPlan plan = PlanOk(batch, Shape(), o);
    REQUIRE(plan.header().partition_keys == 4);
    REQUIRE(plan.items() == PlanOk(batch, Shape(), Fixed(4)).items());
    CheckInvariants(batch, Shape(), plan);
    // Granule 8: only row 5 (10 keys) straddles the cut at 8.
    o.partition_granule = 8;
    plan = PlanOk(batch, Shape(), o);
    REQUIRE(plan.header().partition_keys == 8);
    REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 4, 0, 7, -1), It(0, 4, 1, 0, 8, -1),
                                              It(1, 5, 1, 0, 8, 0), It(3, 6, 2, 0, 2, -1),
                                              It(1, 5, 1, 8, 10, 1)});
    REQUIRE(plan.merges() == std::vector<Merge>{{5, 0, 2, 1}});
    CheckInvariants(batch, Shape(), plan);
    // A target of 12 CTAs (6 items) rules C = 4 out (8 items); C = 8 fits.
    o.partition_granule = 4;
    o.num_sms = 6;
    plan = PlanOk(batch, Shape(), o);
    REQUIRE(plan.header().partition_keys == 8);
    CheckInvariants(batch, Shape(), plan);
  }
}

TEST_CASE("GPU attention plan: edge cases", "[kernels][gpu_plan]") {
  SECTION("context 1: a first decode row attends only itself") {
    BatchInput b;
    b.Clear();
    b.query_start = {0, 1};
    b.context_len = {1};
    b.max_blocks_per_seq = 1;
    b.block_table = {0};
    b.token_ids = {0};
    b.positions = {0};
    b.slot_mapping = {0};
    for (int32_t window : {0, 1, 5}) {
      const GpuAttentionPlan plan = PlanOk(b, Shape(window), Fixed(1));
      REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 1, 0, 1, -1)});
      REQUIRE(plan.merges().empty());
    }
  }
  SECTION("window 1: every row attends only itself, so tiles hold q_len keys") {
    const BatchInput b = MixedBatch();
    const GpuAttentionPlan plan = PlanOk(b, Shape(1), NoSplit());
    REQUIRE(plan.items() == std::vector<Item>{It(0, 0, 4, 3, 7, -1), It(3, 6, 2, 0, 2, -1),
                                              It(0, 4, 1, 7, 8, -1), It(1, 5, 1, 9, 10, -1)});
  }
  SECTION("no rows at all") {
    BatchInput b;
    b.Clear();
    b.query_start = {0, 0, 0};
    b.context_len = {5, 0};
    b.max_blocks_per_seq = 1;
    b.block_table = {0, 1};
    for (const GpuAttentionPlanOptions& o : {GpuAttentionPlanOptions{}, Fixed(2), NoSplit()}) {
      const GpuAttentionPlan plan = PlanOk(b, Shape(), o);
      REQUIRE(plan.items().empty());
      REQUIRE(plan.merges().empty());
      REQUIRE(plan.words().size() == 8);
      REQUIRE(plan.words()[0] == 0);
    }
    b.Clear();
    REQUIRE(PlanOk(b, Shape(), {}).items().empty());
  }
}

TEST_CASE("GPU attention plan: bad inputs name the field", "[kernels][gpu_plan]") {
  BatchInput batch = MixedBatch();
  auto require_bad = [&](const GpuAttentionShape& s, const GpuAttentionPlanOptions& o,
                         const std::string& field) {
    absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(batch), s, o);
    INFO(plan.status().ToString());
    REQUIRE(plan.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(plan.status().message()).find(field) != std::string::npos);
  };
  require_bad({8, 3, 64, 0}, {}, "num_heads");
  require_bad({8, 0, 64, 0}, {}, "num_kv_heads");
  require_bad({8, 2, 7, 0}, {}, "head_dim");
  require_bad({8, 2, 258, 0}, {}, "head_dim");
  require_bad({8, 2, 64, -1}, {}, "sliding_window");
  GpuAttentionPlanOptions o;
  o.num_sms = 0;
  require_bad(Shape(), o, "num_sms");
  o = {};
  o.partition_granule = 0;
  require_bad(Shape(), o, "partition_granule");
  batch.context_len[0] = 4;  // 5 rows cannot end at index 3
  require_bad(Shape(), {}, "context_len");
  batch = MixedBatch();
  batch.query_start = {0, 5, 4, 6, 8};
  require_bad(Shape(), {}, "query_start");
  batch = MixedBatch();
  batch.token_ids.push_back(0);  // 9 tokens, query_start ends at 8
  require_bad(Shape(), {}, "query_start[num_seqs]");
}

TEST_CASE("GPU attention plan: random batches keep the invariants and the bounds",
          "[kernels][gpu_plan]") {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t seqs = 1 + rng() % 6;
    BatchInput b;
    b.Clear();
    int32_t max_context = 0;
    for (int32_t s = 0; s < seqs; ++s) {
      const int32_t ctx = rng() % 3 == 0 ? 1 + rng() % 5000 : rng() % 40;
      const int32_t q = rng() % 4 == 0 ? std::min<int32_t>(ctx, rng() % 40) : std::min(ctx, 1);
      b.context_len.push_back(ctx);
      b.query_start.push_back(b.query_start.back() + q);
      max_context = std::max(max_context, ctx);
    }
    b.token_ids.assign(b.query_start.back(), 0);
    b.positions.assign(b.query_start.back(), 0);
    b.slot_mapping.assign(b.query_start.back(), 0);
    const int32_t kv = 1 + rng() % 4;
    const int32_t group = std::vector<int32_t>{1, 2, 3, 4, 6, 8, 32}[rng() % 7];
    const GpuAttentionShape shape{kv * group, kv, 64, rng() % 3 == 0 ? int32_t(rng() % 300) : 0};
    GpuAttentionPlanOptions o;
    o.num_sms = 1 + rng() % 132;
    o.ctas_per_sm = 1 + rng() % 8;
    o.partition_granule = std::vector<int32_t>{16, 64, 256}[rng() % 3];
    if (rng() % 3 == 0) o.fixed_partition_keys = std::vector<int32_t>{1, 7, 64, 512}[rng() % 4];
    if (rng() % 5 == 0) o.split = false;
    INFO("iteration " << iter);
    const GpuAttentionPlan plan = PlanOk(b, shape, o);
    CheckInvariants(b, shape, plan);
    const GpuAttentionPlanBounds bounds = GpuAttentionBounds(shape, o, b.num_tokens(), max_context);
    if (b.num_tokens() > 0) {
      REQUIRE(plan.header().num_items <= bounds.max_items);
      REQUIRE(plan.header().num_merges <= bounds.max_merges);
      REQUIRE(plan.header().num_partials <= bounds.max_partials);
      REQUIRE(static_cast<int64_t>(plan.words().size()) <= bounds.max_words);
      REQUIRE(GpuAttentionWorkspaceBytes(shape, plan.header().num_partials) <=
              bounds.workspace_bytes);
    }
    if (o.fixed_partition_keys == 0 && o.split && plan.header().num_partials > 0) {
      // An auto split stays within the CTA target.
      REQUIRE(int64_t(plan.header().num_items) * (shape.num_heads / plan.header().heads_per_cta) <=
              int64_t(o.num_sms) * o.ctas_per_sm);
    }
  }
}

TEST_CASE("GPU attention plan: the Llama-3-8B decode shape", "[kernels][gpu_plan]") {
  // 64 decode rows at context 4096, 32 heads over 8 kv heads: 64 x 8 = 512
  // CTAs unsplit. A 528-CTA target (132 SMs x 4) cannot take any split; a
  // 1056-CTA target halves every sequence at 2048.
  BatchInput b;
  b.Clear();
  for (int s = 0; s < 64; ++s) {
    b.context_len.push_back(4096);
    b.query_start.push_back(s + 1);
  }
  b.token_ids.assign(64, 0);
  b.positions.assign(64, 4095);
  b.slot_mapping.assign(64, 0);
  const GpuAttentionShape shape{32, 8, 128, 0};
  GpuAttentionPlanOptions o;
  GpuAttentionPlan plan = PlanOk(b, shape, o);
  REQUIRE(plan.header().num_items == 64);
  REQUIRE(plan.header().num_partials == 0);
  o.ctas_per_sm = 8;
  plan = PlanOk(b, shape, o);
  REQUIRE(plan.header().partition_keys == 2048);
  REQUIRE(plan.header().num_items == 128);
  REQUIRE(plan.header().num_merges == 64);
  REQUIRE(plan.header().num_partials == 128);
  REQUIRE(plan.items()[0] == It(0, 0, 1, 0, 2048, 0));
  REQUIRE(plan.items()[1] == It(0, 0, 1, 2048, 4096, 1));
  // Bounds for graph capture at a fixed split of 512 keys, contexts <= 8192:
  // 16 partitions per row.
  o.fixed_partition_keys = 512;
  const GpuAttentionPlanBounds bounds = GpuAttentionBounds(shape, o, 64, 8192);
  REQUIRE(bounds.max_items == 64 * 16);
  REQUIRE(bounds.max_partials == 64 * 16);
  REQUIRE(bounds.max_merges == 64);
  REQUIRE(bounds.max_words == 8 + 8 * 64 * 16 + 4 * 64);
  REQUIRE(bounds.workspace_bytes == GpuAttentionWorkspaceBytes(shape, 64 * 16));
}

}  // namespace
}  // namespace kvserve
