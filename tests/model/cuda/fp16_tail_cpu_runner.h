// The CPU forward (model/cpu/cpu_forward.h, the CPU runner's compute half)
// over KV pages whose int4_kc layers keep fp16 tails, as the CUDA runner's
// do: the reference the CUDA runner's int4_kc tokens are held to.
//
// Why not the CPU runner itself: it keeps int4_kc tails in fp32 (see
// cache/format/kv_layout.h, "Tails"), the CUDA runner in fp16. That changes the
// function computed, not just its rounding: a sequence's own block is read
// at fp16 precision, and every full block is quantized from fp16-rounded
// rows, so a channel's min/max and the codes differ from the fp32-tail
// run's; greedy tokens part after some tens of positions (stories260K:
// 3 of 4 prompts by generated position 55). The CPU kernels implement fp16
// tails too (kernels/cpu/attention/paged_attention_kc.cc rounds new rows to the
// tail's precision wherever they are read), so this runner computes what
// the CUDA kernels compute, with the CPU's GEMMs.
//
// Block copies, swap-out and swap-in are the CPU runner's (memmove of every
// layer's block or tail); there is no eviction (int4_kc refuses it).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cache/format/kv_dtype_spec.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "model/cpu/cpu_forward.h"
#include "model/model_runner.h"
#include "model/sampling/host_sampling.h"

namespace kvserve::testing {

class Fp16TailCpuRunner final : public ModelRunner {
 public:
  // kv_dtype and the pool sizes as the CUDA runner under test has them.
  static absl::StatusOr<std::unique_ptr<Fp16TailCpuRunner>> Create(
      const LlamaWeights& weights, const KvDtypeSpec& kv_dtype, int block_size, int int4_group_size,
      int32_t num_blocks, int32_t num_swap_blocks, int32_t num_tails, int32_t num_swap_tails) {
    const ModelConfig& c = weights.config;
    absl::StatusOr<std::vector<KvDtype>> dtypes = kv_dtype.Resolve(c.num_layers);
    if (!dtypes.ok()) return dtypes.status();
    std::vector<KvFormat> formats;
    for (KvDtype d : *dtypes) {
      absl::StatusOr<KvFormat> f = KvFormat::Create(d, c.num_kv_heads, c.head_dim, block_size,
                                                    int4_group_size, KvElem::kFp16);
      if (!f.ok()) return f.status();
      formats.push_back(*f);
    }
    absl::StatusOr<std::unique_ptr<CpuForward>> model = CpuForward::Create(weights, 1);
    if (!model.ok()) return model.status();
    return std::unique_ptr<Fp16TailCpuRunner>(new Fp16TailCpuRunner(
        std::move(*model), formats, num_blocks, num_swap_blocks, num_tails, num_swap_tails));
  }

  const ModelConfig& config() const override { return model_->config(); }
  const KvFormat& kv_format() const override { return primary_.format(); }
  int32_t num_blocks() const override { return primary_.num_blocks(); }
  int32_t num_swap_blocks() const override { return swap_.num_blocks(); }
  int32_t num_tail_blocks() const override { return primary_.num_tails(); }
  int32_t num_swap_tail_blocks() const override { return swap_.num_tails(); }
  const RunnerMemoryInfo& memory_info() const override { return info_; }

  using ModelRunner::Forward;
  absl::Status Forward(const BatchInput& batch) override {
    logits_.resize(batch.logits_rows.size() * static_cast<size_t>(config().vocab_size));
    return model_->Forward(batch, primary_, logits_);
  }
  absl::Status Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) override {
    return sampler_.Sample(logits_, config().vocab_size, rows, out);
  }
  absl::Status ReadLogits(std::span<float> logits) override {
    if (logits.size() < logits_.size()) return absl::InvalidArgumentError("logits too small");
    std::copy(logits_.begin(), logits_.end(), logits.begin());
    return absl::OkStatus();
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    return Copy(primary_, primary_, copies);
  }
  absl::Status SwapOut(std::span<const BlockCopy> copies) override {
    return Copy(primary_, swap_, copies);
  }
  absl::Status SwapIn(std::span<const BlockCopy> copies) override {
    return Copy(swap_, primary_, copies);
  }

 private:
  Fp16TailCpuRunner(std::unique_ptr<CpuForward> model, const std::vector<KvFormat>& formats,
                    int32_t num_blocks, int32_t num_swap_blocks, int32_t num_tails,
                    int32_t num_swap_tails)
      : model_(std::move(model)),
        primary_(formats, num_blocks, num_tails),
        swap_(formats, num_swap_blocks, num_swap_tails) {
    info_.device = "cpu";
    info_.weight_dtype = "fp32";
    info_.kv_bytes_per_block = primary_.bytes_per_block();
    info_.num_blocks = num_blocks;
    info_.kv_pool_bytes = primary_.total_bytes();
    info_.kv_pool_tokens = int64_t{num_blocks} * primary_.format().block_size();
    info_.num_swap_blocks = num_swap_blocks;
    info_.pool_sized_from = "cache.num_blocks";
  }

  // Ids past a pool's blocks name its tails (cache/block_copy.h).
  static absl::Status Copy(const HostKvPages& from, HostKvPages& to,
                           std::span<const BlockCopy> copies) {
    for (const BlockCopy& cp : copies) {
      const bool tail = cp.src >= from.num_blocks();
      const int32_t src = tail ? cp.src - from.num_blocks() : cp.src;
      const int32_t dst = tail ? cp.dst - to.num_blocks() : cp.dst;
      if (src < 0 || src >= (tail ? from.num_tails() : from.num_blocks()) || dst < 0 ||
          dst >= (tail ? to.num_tails() : to.num_blocks())) {
        return absl::InternalError(absl::StrCat("copy ", cp.src, " -> ", cp.dst, " outside"));
      }
      for (int l = 0; l < from.num_layers(); ++l) {
        if (tail) {
          const int64_t bytes = from.format(l).tail_block_bytes();
          if (bytes > 0) std::memmove(to.tail(l, dst), from.tail(l, src), bytes);
        } else {
          std::memmove(to.block(l, dst), from.block(l, src), from.format(l).block_bytes());
        }
      }
    }
    return absl::OkStatus();
  }

  std::unique_ptr<CpuForward> model_;
  HostKvPages primary_;
  HostKvPages swap_;
  RunnerMemoryInfo info_;
  HostRowSampler sampler_;
  std::vector<float> logits_;
};

}  // namespace kvserve::testing
