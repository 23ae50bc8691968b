#include "model/eval/evicting_sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

KvCacheConfig ConfigFor(const ModelRunner& runner) {
  KvCacheConfig c;
  c.block_size = runner.kv_format().block_size();
  c.num_blocks = runner.num_blocks();
  c.enable_prefix_caching = false;
  // Formats with tails (int4_kc) run dense: eviction needs a runner that
  // supports it, which those do not.
  c.num_tail_blocks = runner.num_tail_blocks();
  return c;
}

}  // namespace

EvictingSequence::EvictingSequence(ModelRunner& runner,
                                   std::shared_ptr<const EvictionPolicy> policy,
                                   const EvictionParams& params, int32_t hold_limit)
    : runner_(runner), kv_(ConfigFor(runner)) {
  if (policy != nullptr && params.evicts()) {
    evictor_.emplace(std::move(policy), params, hold_limit);
    fresh_ = evictor_;
  }
}

int32_t EvictingSequence::cache_len() const {
  return kv_.Contains(kSeq) ? kv_.num_tokens(kSeq) : 0;
}

int32_t EvictingSequence::StepRows(int32_t prompt_left) const {
  if (!evictor_) return std::max(1, prompt_left);
  return evictor_->StepRows(cache_len(), prompt_left);
}

void EvictingSequence::Reset() {
  if (kv_.Contains(kSeq)) kv_.Free(kSeq);
  kv_.TakePendingCopies();
  if (evictor_) evictor_ = fresh_;
  computed_ = 0;
}

absl::Status EvictingSequence::RunCopies() {
  const StepCopies copies = kv_.TakePendingCopies();
  if (!copies.copies.empty()) KV_RETURN_IF_ERROR(runner_.CopyBlocks(copies.copies));
  if (!copies.slot_moves.empty()) KV_RETURN_IF_ERROR(runner_.MoveSlots(copies.slot_moves));
  return absl::OkStatus();
}

absl::Status EvictingSequence::Step(std::span<const int32_t> stream, int32_t begin, int32_t end,
                                    std::vector<float>* logits) {
  if (begin != computed_ || end <= begin || end > static_cast<int32_t>(stream.size())) {
    return absl::InvalidArgumentError(absl::StrCat("EvictingSequence::Step(", begin, ", ", end,
                                                   ") after ", computed_, " tokens of ",
                                                   stream.size()));
  }
  std::span<const int32_t> rows = stream.subspan(begin, end - begin);
  if (!kv_.Contains(kSeq)) {
    KV_ASSIGN_OR_RETURN(AllocateResult r, kv_.Allocate(kSeq, rows));
    (void)r;
  } else {
    KV_RETURN_IF_ERROR(kv_.Append(kSeq, rows));
  }
  KV_RETURN_IF_ERROR(RunCopies());
  const BlockTable& table = kv_.block_table(kSeq);
  max_blocks_ = std::max(max_blocks_, table.num_blocks());
  const int32_t n = end - begin;
  const int32_t len = table.num_tokens();

  batch_.Clear();
  batch_.token_ids.assign(rows.begin(), rows.end());
  for (int32_t i = begin; i < end; ++i) batch_.positions.push_back(i);
  kv_.AppendSlotMapping(kSeq, len - n, len, &batch_.slot_mapping);
  batch_.query_start.push_back(n);
  batch_.context_len.push_back(len);
  batch_.max_blocks_per_seq = table.num_blocks();
  batch_.block_table.assign(table.blocks().begin(), table.blocks().end());
  for (int32_t i = 0; i < n; ++i) batch_.logits_rows.push_back(i);
  if (kv_.has_tails()) batch_.tail_ids.push_back(kv_.tail_id(kSeq));
  const bool stats = evictor_ && evictor_->needs_attention_stats();
  if (evictor_ && evictor_->num_sinks() > 0) batch_.num_sinks.push_back(evictor_->num_sinks());
  if (stats) batch_.attention_stats.push_back(1);

  logits->resize(static_cast<size_t>(n) * runner_.config().vocab_size);
  KV_RETURN_IF_ERROR(runner_.Forward(batch_, *logits));
  const int32_t layers = runner_.config().num_layers;
  if (stats) {
    stats_.resize(static_cast<size_t>(layers) * len);
    KV_RETURN_IF_ERROR(runner_.ReadAttentionStats(stats_));
  }
  kv_.MarkComputed(kSeq, len);
  computed_ = end;
  if (!evictor_) return absl::OkStatus();

  positions_.assign(batch_.positions.begin(), batch_.positions.end());
  evictor_->Observe(positions_, stats ? std::span<const float>(stats_) : std::span<const float>(),
                    layers, runner_.config().num_heads, n);
  const std::vector<int32_t>& victims = evictor_->SelectVictims();
  if (victims.empty()) return absl::OkStatus();
  KV_ASSIGN_OR_RETURN(EvictResult r, kv_.Evict(kSeq, victims));
  evictor_->Compact(r);
  return RunCopies();
}

}  // namespace kvserve
