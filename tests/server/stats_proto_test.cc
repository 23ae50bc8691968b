// EngineStats -> kvserve.v1.Stats: every wire field comes from its one
// source field (distinct values, so a swapped pair fails).
#include "server/stats_proto.h"

#include <catch2/catch.hpp>

namespace kvserve {
namespace {

TEST_CASE("ToProto fills every Stats field from EngineStats", "[server]") {
  EngineStats s;
  s.num_waiting = 1;
  s.num_running = 2;
  s.num_swapped = 3;
  s.kv.num_blocks = 4;
  s.kv.num_free_blocks = 5;
  s.kv.num_active_blocks = 6;
  s.kv.num_cached_blocks = 7;
  s.kv.active_usage = 0.25;
  s.kv.usage_with_cached = 0.75;
  s.steps = 10;
  s.batched_tokens = 11;
  s.prompt_tokens = 12;
  s.generated_tokens = 13;
  s.preemptions = 14;
  s.kv.prefix_query_tokens = 15;
  s.kv.prefix_hit_tokens = 16;
  s.kv.cow_copies = 17;
  s.kv.swapped_out_blocks = 18;
  s.kv.swapped_in_blocks = 19;
  s.kv.evicted_cached_blocks = 20;
  s.requests_finished_stop = 21;
  s.requests_finished_length = 22;
  s.requests_finished_cancelled = 23;
  s.requests_finished_error = 24;
  s.requests_rejected = 25;

  v1::Stats p;
  p.set_steps(99);  // overwritten
  ToProto(s, &p);
  CHECK(p.num_waiting() == 1);
  CHECK(p.num_running() == 2);
  CHECK(p.num_swapped() == 3);
  CHECK(p.kv_blocks_total() == 4);
  CHECK(p.kv_blocks_free() == 5);
  CHECK(p.kv_blocks_active() == 6);
  CHECK(p.kv_blocks_cached() == 7);
  CHECK(p.kv_usage_active() == 0.25);
  CHECK(p.kv_usage_with_cached() == 0.75);
  CHECK(p.steps() == 10);
  CHECK(p.batched_tokens() == 11);
  CHECK(p.prompt_tokens() == 12);
  CHECK(p.generated_tokens() == 13);
  CHECK(p.preemptions() == 14);
  CHECK(p.prefix_queries_tokens() == 15);
  CHECK(p.prefix_hits_tokens() == 16);
  CHECK(p.cow_copies() == 17);
  CHECK(p.swap_out_blocks() == 18);
  CHECK(p.swap_in_blocks() == 19);
  CHECK(p.cached_block_evictions() == 20);
  CHECK(p.requests_finished_stop() == 21);
  CHECK(p.requests_finished_length() == 22);
  CHECK(p.requests_finished_cancelled() == 23);
  CHECK(p.requests_finished_error() == 24);
  CHECK(p.requests_rejected() == 25);
  // Every field of the message is one of the above.
  CHECK(v1::Stats::descriptor()->field_count() == 25);
}

}  // namespace
}  // namespace kvserve
