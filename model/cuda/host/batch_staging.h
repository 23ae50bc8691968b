// Batch staging: the byte layout in which the CUDA runner uploads a step's
// metadata, and the host-side fill of it. Everything a step's kernels read
// besides weights, activations and the KV pool travels in one pinned host
// buffer and one cudaMemcpyAsync into a device buffer of the same layout:
//
//   token_ids     int32 [T]
//   positions     int32 [T]
//   slot_mapping  int64 [T]        (negative: no K/V write)
//   query_start   int32 [B + 1]
//   context_len   int32 [B]
//   block_table   int32 [B][stride]
//   logits_rows   int32 [R]
//   tail_ids      int32 [B]        (int4_kc tails; -1: none, and for every
//                                   sequence when BatchInput::tail_ids is empty)
//   attention     int32 [W]        (GpuAttentionPlan::words(), kernels/plan/gpu_attention_plan.h)
// Every section starts on a kStagingAlign boundary (the attention plan wants
// 16 bytes; slot_mapping 8), so a section's device address is the buffer's
// plus its offset. Sampling has its own upload (kernels/plan/sampling_batch.h
// packs rows and penalty histories, whose size no shape bounds); it is never
// part of a graph.
//
// CUDA graphs: a graph bakes in device addresses and sizes, so a decode step
// replayed at bucket P is staged with the padded shape PaddedDecodeShape(P,
// ...): T = B = R = P, stride = the largest block table row, W = the plan's
// capacity. Two steps with the same padded shape have the same layout, so the
// graph captured for P reads every step's metadata at the same addresses.
// Padding rows (FillBatchStaging with a padded shape) are harmless: token 0 at
// position 0, slot -1 (no write), one new row per padded sequence with
// context 1, block row of zeros, tail -1, logits rows T_real .. P-1; the attention plan
// has no work for them, and every other kernel is row-independent, so they
// never change a real row.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/batch_input.h"

namespace kvserve {

inline constexpr int64_t kStagingAlign = 16;

// The sizes a layout is made for (padded or not).
struct StagingShape {
  int32_t num_tokens = 0;          // T
  int32_t num_seqs = 0;            // B
  int32_t block_table_stride = 0;  // entries per block table row
  int32_t num_logits_rows = 0;     // R
  int32_t attention_words = 0;     // W

  friend bool operator==(const StagingShape&, const StagingShape&) = default;
};

struct StagingRange {
  int64_t offset = 0;
  int64_t bytes = 0;
};

struct StagingLayout {
  StagingShape shape;
  StagingRange token_ids, positions, slot_mapping, query_start, context_len, block_table,
      logits_rows, tail_ids, attention;
  int64_t total_bytes = 0;  // the one upload: [0, total_bytes)
};

StagingLayout PlanStaging(const StagingShape& shape);

// The shape of an unpadded step (eager).
StagingShape ShapeOfBatch(const BatchInput& batch, int32_t attention_words);

// The shape a decode step replayed at `bucket` is staged with.
StagingShape PaddedDecodeShape(int32_t bucket, int32_t max_blocks_per_seq,
                               int32_t attention_words_capacity);

// True when every sequence of `batch` has exactly one new row and wants its
// logits (a pure decode step, the only kind replayed from a graph).
bool IsPureDecode(const BatchInput& batch);

// Writes every section of `layout` into dst[0, layout.total_bytes). The batch must fit the layout's
// shape (T, B, R and its block table width at most the shape's, attention words at most W); rows
// past the batch are padding as described above, bytes between sections are zero. InvalidArgument
// names what does not fit.
absl::Status FillBatchStaging(const BatchInput& batch, std::span<const int32_t> attention_words,
                              const StagingLayout& layout, std::span<uint8_t> dst);

}  // namespace kvserve
