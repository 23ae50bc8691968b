#include "model/cpu/cpu_model_runner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "kernels/cpu/kv/copy_blocks.h"
#include "kernels/cpu/kv/move_slots.h"
#include "model/batch_check.h"
#include "model/loader/quantize_weights.h"
#include "util/status_macros.h"

namespace kvserve {

absl::StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    LlamaWeights weights, const CpuRunnerOptions& options) {
  const ModelConfig& c = weights.config;
  KV_RETURN_IF_ERROR(c.Validate());
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.block_size must be > 0, got ", options.block_size));
  }
  if (options.num_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_blocks must be >= 0, got ", options.num_blocks));
  }
  if (options.num_swap_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_swap_blocks must be >= 0, got ", options.num_swap_blocks));
  }
  if (options.num_tail_blocks < 0 || options.num_swap_tail_blocks < 0) {
    return absl::InvalidArgumentError("cache tail blocks must be >= 0");
  }
  const std::vector<KvLayerDims> dims =
      options.low_rank ? LowRankLayerDims(*options.low_rank) : std::vector<KvLayerDims>{};
  KV_ASSIGN_OR_RETURN(KvLayers layers,
                      ResolveKvLayers(options.kv_dtype,
                                      {c.num_layers, c.num_kv_heads, c.head_dim, options.block_size,
                                       options.int4_group_size, KvElem::kFp32},
                                      "cache.kv_dtype", dims, options.cross_layer));
  const bool tails = layers.has_tails();
  if (options.cross_layer.enabled() && options.low_rank) {
    return absl::InvalidArgumentError(
        "cache.cross_layer: not with cache.low_rank (its latents are not a layer's K/V)");
  }
  if (tails && options.low_rank) {
    return absl::InvalidArgumentError(
        "cache.low_rank: int4_kc and int2_kc layers (per-block K ranges, full-precision tails) "
        "do not take "
        "low-rank latents; use a per-token cache.kv_dtype");
  }
  const int32_t num_tails = !tails                        ? 0
                            : options.num_tail_blocks > 0 ? options.num_tail_blocks
                                                          : kDefaultTailBlocks;
  const int32_t num_swap_tails = !tails || options.num_swap_blocks == 0 ? 0
                                 : options.num_swap_tail_blocks > 0 ? options.num_swap_tail_blocks
                                                                    : num_tails;
  const int32_t num_blocks = options.num_blocks > 0
                                 ? options.num_blocks
                                 : BlocksForTokens(c.max_position_embeddings, options.block_size);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> model,
                      CpuForward::Create(std::move(weights), options.num_threads, options.low_rank,
                                         options.cross_layer));
  return std::unique_ptr<CpuModelRunner>(
      new CpuModelRunner(std::move(model), layers.formats, num_blocks, options.num_swap_blocks,
                         num_tails, num_swap_tails, options.pool_sized_from));
}

CpuModelRunner::CpuModelRunner(std::unique_ptr<CpuForward> model,
                               const std::vector<KvFormat>& formats, int32_t num_blocks,
                               int32_t num_swap_blocks, int32_t num_tails, int32_t num_swap_tails,
                               const std::string& pool_sized_from)
    : model_(std::move(model)),
      primary_(formats, num_blocks, num_tails),
      swap_(formats, num_swap_blocks, num_swap_tails) {
  RunnerMemoryInfo& m = memory_info_;
  m.device = "cpu";
  m.weight_dtype = model_->weights().weight_quant.ToString();
  m.weight_bytes = ForwardWeightBytes(model_->weights());
  m.kv_bytes_per_block = primary_.bytes_per_block();
  m.num_blocks = num_blocks;
  m.kv_pool_bytes = primary_.total_bytes();  // int4_kc tails included
  m.kv_pool_tokens = int64_t{num_blocks} * primary_.format().block_size();
  m.num_swap_blocks = num_swap_blocks;
  m.pool_sized_from = pool_sized_from;
  if (const QuantizedLinears* q = model_->weights().quantized.get()) {
    m.quantized_weights = q->num_weights;
    m.quantize_seconds = q->seconds;
    m.quantize_threads = q->threads;
  }
}

absl::Status CpuModelRunner::Forward(const BatchInput& batch) {
  logits_.resize(batch.logits_rows.size() * static_cast<size_t>(model_->config().vocab_size));
  absl::Status s = model_->Forward(batch, primary_, logits_);
  if (!s.ok()) logits_.clear();
  return s;
}

bool CpuModelRunner::partial_rows_in_blocks() const {
  return PartialRowsInBlocks(primary_.formats());
}

absl::Status CpuModelRunner::Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) {
  return sampler_.Sample(logits_, model_->config().vocab_size, rows, out);
}

absl::Status CpuModelRunner::ReadLogits(std::span<float> logits) {
  if (logits.size() < logits_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("logits buffer has ", logits.size(),
                                                   " floats, the batch needs ", logits_.size()));
  }
  std::copy(logits_.begin(), logits_.end(), logits.begin());
  return absl::OkStatus();
}

absl::Status CpuModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  cpu::CopyBlocks(primary_, primary_, copies, "CpuModelRunner::CopyBlocks");
  return absl::OkStatus();
}

absl::Status CpuModelRunner::SwapOut(std::span<const BlockCopy> copies) {
  cpu::CopyBlocks(primary_, swap_, copies, "CpuModelRunner::SwapOut");
  return absl::OkStatus();
}

absl::Status CpuModelRunner::SwapIn(std::span<const BlockCopy> copies) {
  cpu::CopyBlocks(swap_, primary_, copies, "CpuModelRunner::SwapIn");
  return absl::OkStatus();
}

absl::Status CpuModelRunner::MoveSlots(std::span<const SlotMove> moves) {
  if (primary_.has_tails()) {
    return absl::UnimplementedError("KV slot moves need a format without tails (not int4_kc)");
  }
  if (low_rank()) {
    return absl::UnimplementedError(
        "cache.low_rank: KV slot moves are refused (low-rank keys sit at their cache index)");
  }
  const int bs = primary_.format().block_size();
  CheckSlotMoves(moves, int64_t{primary_.num_blocks()} * bs, "CpuModelRunner::MoveSlots");
  cpu::MoveSlots(primary_, moves);
  return absl::OkStatus();
}

absl::Status CpuModelRunner::ReadAttentionStats(std::span<float> out) {
  std::span<const float> stats = model_->attention_stats();
  if (out.size() < stats.size()) {
    return absl::InvalidArgumentError(absl::StrCat("attention stats buffer has ", out.size(),
                                                   " floats, the batch recorded ", stats.size()));
  }
  std::copy(stats.begin(), stats.end(), out.begin());
  return absl::OkStatus();
}

namespace {

void CheckTierBlocks(const HostKvPages& pages, std::span<const BlockId> blocks, size_t buffers,
                     const char* what) {
  for (BlockId b : blocks) {
    if (b < 0 || b >= pages.num_blocks() || buffers != blocks.size()) {
      std::fprintf(stderr, "CpuModelRunner::%s: block %d of %d, %zu buffers for %zu blocks\n", what,
                   b, pages.num_blocks(), buffers, blocks.size());
      std::abort();
    }
  }
}

}  // namespace

absl::Status CpuModelRunner::ExportBlocks(std::span<const BlockId> blocks, std::span<uint8_t> out) {
  const int64_t per_block = tier_block_bytes();
  CheckTierBlocks(primary_, blocks,
                  out.size() == blocks.size() * static_cast<size_t>(per_block) ? blocks.size() : 0,
                  "ExportBlocks");
  uint8_t* dst = out.data();
  for (BlockId b : blocks) {
    for (int l = 0; l < primary_.num_layers(); ++l) {
      const int64_t n = primary_.format(l).block_bytes();
      std::memcpy(dst, primary_.block(l, b), n);
      dst += n;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::ImportBlocks(std::span<const BlockId> blocks,
                                          std::span<const uint8_t* const> in) {
  CheckTierBlocks(primary_, blocks, in.size(), "ImportBlocks");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const uint8_t* src = in[i];
    for (int l = 0; l < primary_.num_layers(); ++l) {
      const int64_t n = primary_.format(l).block_bytes();
      std::memcpy(primary_.block(l, blocks[i]), src, n);
      src += n;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve
