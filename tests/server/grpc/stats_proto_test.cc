// EngineStats -> kvserve.v1.Stats: every wire field comes from its one
// source field (each gets a distinct value, so a swapped pair fails).
#include "server/grpc/stats_proto.h"

#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

namespace kvserve {
namespace {

// One wire field: how to set its source in EngineStats, how to read it back.
struct Field {
  std::string name;
  std::function<void(EngineStats&, int64_t)> set;
  std::function<double(const v1::Stats&)> get;
};

// clang-format off
#define KV_FIELD(wire, source)                                   \
  Field{#wire, [](EngineStats& s, int64_t v) { s.source = v; },  \
        [](const v1::Stats& p) { return static_cast<double>(p.wire()); }}
// clang-format on

TEST_CASE("ToProto fills every Stats field from EngineStats", "[server]") {
  const std::vector<Field> fields = {
      KV_FIELD(num_waiting, num_waiting),
      KV_FIELD(num_running, num_running),
      KV_FIELD(num_swapped, num_swapped),
      KV_FIELD(kv_blocks_total, kv.num_blocks),
      KV_FIELD(kv_blocks_free, kv.num_free_blocks),
      KV_FIELD(kv_blocks_active, kv.num_active_blocks),
      KV_FIELD(kv_blocks_cached, kv.num_cached_blocks),
      KV_FIELD(kv_usage_active, kv.active_usage),
      KV_FIELD(kv_usage_with_cached, kv.usage_with_cached),
      KV_FIELD(steps, steps),
      KV_FIELD(batched_tokens, batched_tokens),
      KV_FIELD(prompt_tokens, prompt_tokens),
      KV_FIELD(generated_tokens, generated_tokens),
      KV_FIELD(preemptions, preemptions),
      KV_FIELD(prefix_queries_tokens, kv.prefix_query_tokens),
      KV_FIELD(prefix_hits_tokens, kv.prefix_hit_tokens),
      KV_FIELD(cow_copies, kv.cow_copies),
      KV_FIELD(swap_out_blocks, kv.swapped_out_blocks),
      KV_FIELD(swap_in_blocks, kv.swapped_in_blocks),
      KV_FIELD(cached_block_evictions, kv.evicted_cached_blocks),
      KV_FIELD(requests_finished_stop, requests_finished_stop),
      KV_FIELD(requests_finished_length, requests_finished_length),
      KV_FIELD(requests_finished_cancelled, requests_finished_cancelled),
      KV_FIELD(requests_finished_error, requests_finished_error),
      KV_FIELD(requests_rejected, requests_rejected),
  };
  // Every field of the message is listed.
  REQUIRE(v1::Stats::descriptor()->field_count() == static_cast<int>(fields.size()));
  EngineStats s;
  for (size_t i = 0; i < fields.size(); ++i) fields[i].set(s, static_cast<int64_t>(i + 1));
  v1::Stats p;
  p.set_steps(999);  // overwritten
  ToProto(s, &p);
  for (size_t i = 0; i < fields.size(); ++i) {
    INFO(fields[i].name);
    CHECK(fields[i].get(p) == static_cast<double>(i + 1));
  }
}

#undef KV_FIELD

}  // namespace
}  // namespace kvserve
