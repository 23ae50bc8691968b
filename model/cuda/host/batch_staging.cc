#include "model/cuda/host/batch_staging.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

int64_t AlignUp(int64_t n) { return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

// Appends a section of `bytes` at the next aligned offset.
StagingRange Take(int64_t* cursor, int64_t bytes) {
  StagingRange r{AlignUp(*cursor), bytes};
  *cursor = r.offset + bytes;
  return r;
}

template <typename T>
T* At(std::span<uint8_t> dst, const StagingRange& r) {
  return reinterpret_cast<T*>(dst.data() + r.offset);
}

absl::Status DoesNotFit(const char* what, int64_t have, int64_t room) {
  return absl::InvalidArgumentError(
      absl::StrCat("batch staging: ", what, " is ", have, ", the layout has room for ", room));
}

}  // namespace

StagingLayout PlanStaging(const StagingShape& s) {
  StagingLayout l;
  l.shape = s;
  int64_t c = 0;
  l.token_ids = Take(&c, int64_t{s.num_tokens} * 4);
  l.positions = Take(&c, int64_t{s.num_tokens} * 4);
  l.slot_mapping = Take(&c, int64_t{s.num_tokens} * 8);
  l.query_start = Take(&c, (int64_t{s.num_seqs} + 1) * 4);
  l.context_len = Take(&c, int64_t{s.num_seqs} * 4);
  l.block_table = Take(&c, int64_t{s.num_seqs} * s.block_table_stride * 4);
  l.logits_rows = Take(&c, int64_t{s.num_logits_rows} * 4);
  l.tail_ids = Take(&c, int64_t{s.num_seqs} * 4);
  l.attention = Take(&c, int64_t{s.attention_words} * 4);
  l.total_bytes = AlignUp(c);
  return l;
}

StagingShape ShapeOfBatch(const BatchInput& batch, int32_t attention_words) {
  StagingShape s;
  s.num_tokens = batch.num_tokens();
  s.num_seqs = batch.num_seqs();
  s.block_table_stride = batch.max_blocks_per_seq;
  s.num_logits_rows = static_cast<int32_t>(batch.logits_rows.size());
  s.attention_words = attention_words;
  return s;
}

StagingShape PaddedDecodeShape(int32_t bucket, int32_t max_blocks_per_seq,
                               int32_t attention_words_capacity) {
  StagingShape s;
  s.num_tokens = bucket;
  s.num_seqs = bucket;
  s.block_table_stride = max_blocks_per_seq;
  s.num_logits_rows = bucket;
  s.attention_words = attention_words_capacity;
  return s;
}

bool IsPureDecode(const BatchInput& batch) {
  const int32_t B = batch.num_seqs();
  if (B == 0 || batch.num_tokens() != B || static_cast<int32_t>(batch.logits_rows.size()) != B) {
    return false;
  }
  for (int32_t b = 0; b < B; ++b) {
    if (batch.query_start[b + 1] != b + 1 || batch.logits_rows[b] != b) return false;
  }
  return true;
}

absl::Status FillBatchStaging(const BatchInput& batch, std::span<const int32_t> attention_words,
                              const StagingLayout& layout, std::span<uint8_t> dst) {
  const StagingShape& s = layout.shape;
  const int32_t T = batch.num_tokens(), B = batch.num_seqs();
  const int32_t R = static_cast<int32_t>(batch.logits_rows.size());
  if (static_cast<int64_t>(dst.size()) < layout.total_bytes) {
    return DoesNotFit("the buffer's byte size", static_cast<int64_t>(dst.size()),
                      layout.total_bytes);
  }
  if (T > s.num_tokens) return DoesNotFit("num_tokens", T, s.num_tokens);
  if (B > s.num_seqs) return DoesNotFit("num_seqs", B, s.num_seqs);
  if (R > s.num_logits_rows) return DoesNotFit("the logits row count", R, s.num_logits_rows);
  if (batch.max_blocks_per_seq > s.block_table_stride) {
    return DoesNotFit("max_blocks_per_seq", batch.max_blocks_per_seq, s.block_table_stride);
  }
  if (static_cast<int64_t>(attention_words.size()) > s.attention_words) {
    return DoesNotFit("the attention plan's word count",
                      static_cast<int64_t>(attention_words.size()), s.attention_words);
  }
  // Each padded sequence owns exactly one padded row, and padded logits
  // rows name padded rows.
  if (s.num_tokens - T != s.num_seqs - B) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch staging: ", s.num_tokens - T, " padding rows for ", s.num_seqs - B,
                     " padding sequences; each padding sequence has exactly one row"));
  }
  if (s.num_logits_rows - R > s.num_tokens - T) {
    return DoesNotFit("the padding logits row count", s.num_logits_rows - R, s.num_tokens - T);
  }
  std::memset(dst.data(), 0, layout.total_bytes);

  int32_t* tokens = At<int32_t>(dst, layout.token_ids);
  int32_t* positions = At<int32_t>(dst, layout.positions);
  int64_t* slots = At<int64_t>(dst, layout.slot_mapping);
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), tokens);
  std::copy(batch.positions.begin(), batch.positions.end(), positions);
  std::copy(batch.slot_mapping.begin(), batch.slot_mapping.end(), slots);
  std::fill(slots + T, slots + s.num_tokens, int64_t{-1});  // tokens and positions stay 0

  int32_t* query_start = At<int32_t>(dst, layout.query_start);
  int32_t* context_len = At<int32_t>(dst, layout.context_len);
  std::copy(batch.query_start.begin(), batch.query_start.end(), query_start);
  std::copy(batch.context_len.begin(), batch.context_len.end(), context_len);
  // Padded sequence b owns row T + (b - B) and has context 1.
  for (int32_t b = B; b < s.num_seqs; ++b) {
    query_start[b + 1] = T + (b - B) + 1;
    context_len[b] = 1;
  }

  int32_t* table = At<int32_t>(dst, layout.block_table);
  for (int32_t b = 0; b < B; ++b) {
    const int32_t* row = batch.BlockRow(b);
    std::copy(row, row + batch.max_blocks_per_seq,
              table + static_cast<int64_t>(b) * s.block_table_stride);
  }

  int32_t* logits_rows = At<int32_t>(dst, layout.logits_rows);
  std::copy(batch.logits_rows.begin(), batch.logits_rows.end(), logits_rows);
  for (int32_t i = R; i < s.num_logits_rows; ++i) logits_rows[i] = T + (i - R);

  if (!batch.tail_ids.empty() && static_cast<int32_t>(batch.tail_ids.size()) != B) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch staging: tail_ids has ", batch.tail_ids.size(), " entries for ", B, " sequences"));
  }
  int32_t* tail_ids = At<int32_t>(dst, layout.tail_ids);
  std::fill(tail_ids, tail_ids + s.num_seqs, -1);
  std::copy(batch.tail_ids.begin(), batch.tail_ids.end(), tail_ids);

  std::copy(attention_words.begin(), attention_words.end(), At<int32_t>(dst, layout.attention));
  return absl::OkStatus();
}

}  // namespace kvserve
