// SamplingBatch: the per-step host side of device sampling. It validates
// each row's parameters and token ids (naming the field), fills the rows'
// history ranges, and packs everything into one buffer for one upload:
//
//   [num_rows x SampleRowParams (64 B each)][history: int32 ids]
//
// so on the device rows = base and history = base + HistoryByteOffset().
// A row's history (prompt ids, then output ids) is stored only when one of
// its penalties is on; other rows get empty ranges, which keeps the upload
// to the few bytes of the parameters for ordinary requests.
//
// Example:
//   SamplingBatch batch(vocab);
//   KV_RETURN_IF_ERROR(batch.AddRow(params, prompt_ids, output_ids));
//   batch.PackInto(pinned_staging);      // PackedBytes() bytes
//   cudaMemcpyAsync(d_buf, pinned_staging, batch.PackedBytes(), ...);
//
// Thread-safety: none; one per engine thread. Buffers are reused across
// steps (Clear keeps capacity).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/sample_rows.h"

namespace kvserve {

class SamplingBatch {
 public:
  // vocab in [1, kMaxSampleVocab] (checked by AddRow).
  explicit SamplingBatch(int32_t vocab) : vocab_(vocab) {}

  // Appends one row; params' history fields are ignored and filled here.
  // InvalidArgument naming the field: temperature (finite, >= 0), top_p (in
  // (0, 1]), min_p (in [0, 1)), repetition_penalty (finite, > 0),
  // frequency_penalty / presence_penalty (finite), num_top_logprobs (in
  // [-1, 20]), prompt[i] / output[i] (in [0, vocab), checked only when a
  // penalty reads them), output length (< 2^30). The batch is unchanged on
  // error.
  absl::Status AddRow(const SampleRowParams& params, absl::Span<const int32_t> prompt,
                      absl::Span<const int32_t> output);

  int32_t vocab() const { return vocab_; }
  int32_t num_rows() const { return static_cast<int32_t>(rows_.size()); }
  const std::vector<SampleRowParams>& rows() const { return rows_; }
  const std::vector<int32_t>& history() const { return history_; }

  int64_t HistoryByteOffset() const {
    return static_cast<int64_t>(rows_.size()) * static_cast<int64_t>(sizeof(SampleRowParams));
  }
  int64_t PackedBytes() const {
    return HistoryByteOffset() + static_cast<int64_t>(history_.size()) * 4;
  }
  // Writes PackedBytes() bytes to dst.
  void PackInto(uint8_t* dst) const;

  void Clear() {
    rows_.clear();
    history_.clear();
  }

 private:
  int32_t vocab_;
  std::vector<SampleRowParams> rows_;
  std::vector<int32_t> history_;
};

// True when a row's penalties read its history.
inline bool UsesHistory(const SampleRowParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

}  // namespace kvserve
