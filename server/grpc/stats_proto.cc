#include "server/grpc/stats_proto.h"

namespace kvserve {

void ToProto(const EngineStats& s, v1::Stats* out) {
  out->Clear();
  out->set_num_waiting(s.num_waiting);
  out->set_num_running(s.num_running);
  out->set_num_swapped(s.num_swapped);
  out->set_kv_blocks_total(s.kv.num_blocks);
  out->set_kv_blocks_free(s.kv.num_free_blocks);
  out->set_kv_blocks_active(s.kv.num_active_blocks);
  out->set_kv_blocks_cached(s.kv.num_cached_blocks);
  out->set_kv_usage_active(s.kv.active_usage);
  out->set_kv_usage_with_cached(s.kv.usage_with_cached);
  out->set_steps(s.steps);
  out->set_batched_tokens(s.batched_tokens);
  out->set_prompt_tokens(s.prompt_tokens);
  out->set_generated_tokens(s.generated_tokens);
  out->set_preemptions(s.preemptions);
  out->set_prefix_queries_tokens(s.kv.prefix_query_tokens);
  out->set_prefix_hits_tokens(s.kv.prefix_hit_tokens);
  out->set_cow_copies(s.kv.cow_copies);
  out->set_swap_out_blocks(s.kv.swapped_out_blocks);
  out->set_swap_in_blocks(s.kv.swapped_in_blocks);
  out->set_cached_block_evictions(s.kv.evicted_cached_blocks);
  out->set_requests_finished_stop(s.requests_finished_stop);
  out->set_requests_finished_length(s.requests_finished_length);
  out->set_requests_finished_cancelled(s.requests_finished_cancelled);
  out->set_requests_finished_error(s.requests_finished_error);
  out->set_requests_rejected(s.requests_rejected);
}

}  // namespace kvserve
