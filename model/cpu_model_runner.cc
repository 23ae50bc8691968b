#include "model/cpu_model_runner.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/status_macros.h"

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
  KV_ASSIGN_OR_RETURN(KvFormat format,
                      KvFormat::Create(options.kv_dtype, c.num_kv_heads, c.head_dim,
                                       options.block_size, options.int4_group_size));
  const int32_t num_blocks =
      options.num_blocks > 0
          ? options.num_blocks
          : (c.max_position_embeddings + options.block_size - 1) / options.block_size;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                      LlamaModel::Create(std::move(weights), options.num_threads));
  return std::unique_ptr<CpuModelRunner>(
      new CpuModelRunner(std::move(model), format, num_blocks, options.num_swap_blocks,
                         options.pool_sized_from));
}

CpuModelRunner::CpuModelRunner(std::unique_ptr<LlamaModel> model, const KvFormat& format,
                               int32_t num_blocks, int32_t num_swap_blocks,
                               const std::string& pool_sized_from)
    : model_(std::move(model)),
      primary_(format, model_->config().num_layers, num_blocks),
      swap_(format, model_->config().num_layers, num_swap_blocks) {
  const ModelConfig& c = model_->config();
  RunnerMemoryInfo& m = memory_info_;
  m.device = "cpu";
  m.weight_dtype = "fp32";
  m.weight_bytes = c.NumParams() * int64_t{sizeof(float)};
  m.kv_bytes_per_block = format.block_bytes() * c.num_layers;
  m.num_blocks = num_blocks;
  m.kv_pool_bytes = primary_.total_bytes();
  m.kv_pool_tokens = int64_t{num_blocks} * format.block_size();
  m.num_swap_blocks = num_swap_blocks;
  m.pool_sized_from = pool_sized_from;
}

absl::Status CpuModelRunner::Forward(const BatchInput& batch) {
  logits_.resize(batch.logits_rows.size() * static_cast<size_t>(model_->config().vocab_size));
  absl::Status s = model_->Forward(batch, primary_, logits_);
  if (!s.ok()) logits_.clear();
  return s;
}

absl::Status CpuModelRunner::Sample(std::span<const SampleRow> rows,
                                    std::span<SampledToken> out) {
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

void CpuModelRunner::CopyAcross(const HostKvPages& from, HostKvPages& to,
                                std::span<const BlockCopy> copies, const char* what) {
  const int64_t bytes = from.format().block_bytes();
  for (const BlockCopy& cp : copies) {
    if (cp.src < 0 || cp.src >= from.num_blocks() || cp.dst < 0 || cp.dst >= to.num_blocks()) {
      std::fprintf(stderr, "CpuModelRunner::%s: block copy %d -> %d outside the pools (%d, %d)\n",
                   what, cp.src, cp.dst, from.num_blocks(), to.num_blocks());
      std::abort();
    }
    for (int l = 0; l < from.num_layers(); ++l) {
      std::memmove(to.block(l, cp.dst), from.block(l, cp.src), bytes);
    }
  }
}

absl::Status CpuModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  CopyAcross(primary_, primary_, copies, "CopyBlocks");
  return absl::OkStatus();
}

absl::Status CpuModelRunner::SwapOut(std::span<const BlockCopy> copies) {
  CopyAcross(primary_, swap_, copies, "SwapOut");
  return absl::OkStatus();
}

absl::Status CpuModelRunner::SwapIn(std::span<const BlockCopy> copies) {
  CopyAcross(swap_, primary_, copies, "SwapIn");
  return absl::OkStatus();
}

}  // namespace kvserve
