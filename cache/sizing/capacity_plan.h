// Capacity planning: how many tokens and sequences a KV cache holds in a
// memory budget, per KV format, computed from the exact page layout
// (ResolveKvLayers, kv_layers.h, as the runners size their pools), so the
// plan and the pool the engine builds agree.
//
// Arithmetic (per format):
//   block_bytes     = num_layers * KvFormat::block_bytes() (padded pages)
//   bytes_per_token = block_bytes / block_size (rounded up): what a token
//                     costs as allocated, scales and padding included
//   kv_budget       = memory - weights               (0 when weights do not fit)
//   num_blocks      = floor(kv_budget / block_bytes); tokens = blocks * block_size
//   seqs at context = floor(num_blocks / ceil(context / block_size))
//   batch bytes     = batch * ceil(context / block_size) * block_bytes
//                     (+ tail_bytes)
// int4_kc keeps each running sequence's partial block in a full-precision
// tail: the plan reserves TailBlocksFor(max_seqs) = 2 * max_seqs tails (what the engine reserves
// for scheduler.max_num_seqs), in fp16 as the GPU keeps them (the CPU backend's fp32 tails take
// twice that), before splitting the budget into blocks:
//   num_blocks      = floor((kv_budget - tail_bytes) / block_bytes)
// Per-layer specs (kv_dtype_spec.h) sum their layers' bytes.
// Example (Llama-2-70B: 80 layers, 8 kv heads, head_dim 128, fp16):
// 80 * 8 * (256 + 256) = 327,680 bytes = 320 KiB per token; 32 sequences of
// 4096 tokens take 131,072 tokens * 320 KiB = 40 GiB = 42.9 GB.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/format/kv_dtype_spec.h"
#include "cache/format/kv_format.h"
#include "cache/sizing/kv_layers.h"

namespace kvserve {

struct CapacityPlanRequest {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t weight_bytes = 0;    // subtracted from memory_bytes first
  int64_t memory_bytes = 0;    // the whole budget (device memory for the model)
  int64_t context_tokens = 0;  // tokens per sequence
  int block_size = 16;
  int int4_group_size = 64;
  int64_t batch = 0;  // sequences whose need to report (0: none)
  // Formats to plan; empty: DefaultPlanDtypes(block_size).
  std::vector<KvDtypeSpec> dtypes;
  // Running sequences whose int4_kc tails are reserved (twice over).
  int64_t max_seqs = 64;
  // Low-rank latents (model/lowrank/low_rank_kv.h): every layer's page
  // shape; formats with tails (int4_kc), which refuse latents, are left
  // out. Empty: the model's shape.
  std::vector<KvLayerDims> layer_dims;
  // Cross-layer KV sharing (cache/format/kv_cross_layer.h): its pairs'
  // pages and fp32 tails; int4_kc / int2_kc rows, which refuse it, are left
  // out. Off by default.
  KvCrossLayerSpec cross_layer;
};

struct KvFormatCapacity {
  KvDtypeSpec spec = KvDtype::kFp16;  // what this row plans
  KvDtype dtype = KvDtype::kFp16;     // spec's first layer's (its only one if uniform)
  int64_t bytes_per_token = 0;        // all layers, as allocated (block_bytes / block_size)
  int64_t block_bytes = 0;            // one block in all layers, padded
  int64_t kv_budget_bytes = 0;        // memory - weights, at least 0
  int64_t num_blocks = 0;
  int64_t num_tokens = 0;       // num_blocks * block_size
  int64_t blocks_per_seq = 0;   // ceil(context / block_size)
  int64_t max_seqs = 0;         // sequences of context_tokens that fit at once
  int64_t batch_bytes = 0;      // what `batch` sequences of context_tokens need (+ tails)
  bool batch_fits = false;      // batch_bytes <= kv_budget_bytes
  double tokens_vs_fp16 = 0.0;  // fp16 bytes per token / this format's
  int64_t num_tail_blocks = 0;  // int4_kc, int2_kc: tails reserved (2 * max_seqs)
  int64_t tail_bytes = 0;       // their bytes, all layers, fp16
  // num_tokens / fp16's num_tokens in this budget: padding and tails included.
  double tokens_vs_fp16_in_budget = 0.0;
};

// Every dtype in kCpuKvDtypes that this block size allows (int4_kc and
// int2_kc need kInt4KcMinBlockSize tokens).
std::vector<KvDtypeSpec> DefaultPlanDtypes(int block_size);

// One entry per KV format, in req.dtypes order.
// InvalidArgument names the bad field (non-positive shape, context or block
// size, negative budget or weights, a group size that does not divide
// head_dim, a per-layer spec that does not fit num_layers, int4_kc with
// blocks under 16 tokens).
absl::StatusOr<std::vector<KvFormatCapacity>> PlanCapacity(const CapacityPlanRequest& req);

}  // namespace kvserve
