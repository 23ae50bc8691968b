// Host-side checks and argument fill that the two attention launchers share
// (PagedAttention in paged_attention.cu, PagedAttentionKc in
// paged_attention_kc.cu): heads, scale, window, dtype and strides; the
// plan's counts, the pointers and the workspace; the skeleton's
// AttentionArgs. Each launcher checks its own layout before, and its own
// extras after, in an order its tests pin: the first bad field is the one
// named, so the checks run in the order the launchers always made them.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/attention_skeleton.cuh"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/attention/paged_attention_kc.h"
#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve::cuda::attention_launch {

// InvalidArgument statuses that start with the launcher's name.
class Errors {
 public:
  explicit constexpr Errors(const char* launcher) : launcher_(launcher) {}

  absl::Status Bad(const char* field, const char* rule, int64_t value) const {
    return absl::InvalidArgumentError(
        absl::StrCat(launcher_, ": ", field, " must be ", rule, ", got ", value));
  }
  absl::Status Null(const char* field) const {
    return absl::InvalidArgumentError(absl::StrCat(launcher_, ": ", field, " is null"));
  }
  absl::Status Invalid(const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat(launcher_, ": ", what));
  }

 private:
  const char* launcher_;
};

inline bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// What the shared checks resolved.
struct Checked {
  int64_t q_stride = 0;    // stride 0 resolved to num_heads * head_dim
  int64_t out_stride = 0;  // likewise
  int32_t heads_per_cta = 0;
  GpuAttentionShape shape;
  bool empty = false;  // no items and no merges: the launcher launches nothing
};

// Heads, scale, sliding window, dtype, then the q and out strides (after
// the launcher's layout checks: head_dim and num_kv_heads are valid).
inline absl::Status CheckHeadsAndStrides(const Errors& err, const PagedAttentionParams& p,
                                         Checked& c) {
  const KvPageLayout& layout = p.kv.layout;
  if (p.num_heads <= 0 || p.num_heads % layout.num_kv_heads != 0) {
    return err.Bad("num_heads", "a positive multiple of num_kv_heads", p.num_heads);
  }
  if (!std::isfinite(p.scale)) return err.Invalid("scale must be finite");
  if (p.sliding_window < 0) return err.Bad("sliding_window", ">= 0", p.sliding_window);
  if (p.dtype != ActDtype::kFp32 && p.dtype != ActDtype::kFp16 && p.dtype != ActDtype::kBf16) {
    return err.Bad("dtype", "fp32, fp16 or bf16", static_cast<int64_t>(p.dtype));
  }
  const int64_t row_elems = int64_t(p.num_heads) * layout.head_dim;
  c.q_stride = p.q_stride == 0 ? row_elems : p.q_stride;
  c.out_stride = p.out_stride == 0 ? row_elems : p.out_stride;
  if (c.q_stride < row_elems) return err.Bad("q_stride", ">= num_heads * head_dim", c.q_stride);
  if (c.out_stride < row_elems) {
    return err.Bad("out_stride", ">= num_heads * head_dim", c.out_stride);
  }
  return absl::OkStatus();
}

// The plan's counts (c.empty when there is nothing to launch; the rest is
// then not checked), heads_per_cta, the pointers and the workspace. `kc`
// (null for PagedAttention) adds int4_kc's step K/V, tails and tail ids.
inline absl::Status CheckPlan(const Errors& err, const PagedAttentionParams& p,
                              const PagedAttentionKcParams* kc, Checked& c) {
  const GpuAttentionLaunch& launch = p.launch;
  c.heads_per_cta = GpuAttentionHeadsPerCta(p.num_heads, p.kv.layout.num_kv_heads);
  if (launch.num_items < 0) return err.Bad("launch.num_items", ">= 0", launch.num_items);
  if (launch.num_merges < 0) return err.Bad("launch.num_merges", ">= 0", launch.num_merges);
  if (launch.num_partials < 0) return err.Bad("launch.num_partials", ">= 0", launch.num_partials);
  if (launch.num_items == 0) {
    if (launch.num_merges != 0) {
      return err.Bad("launch.num_merges", "0 without items", launch.num_merges);
    }
    c.empty = true;
    return absl::OkStatus();
  }
  if (launch.heads_per_cta != c.heads_per_cta) {
    return err.Bad("launch.heads_per_cta", "GpuAttentionHeadsPerCta(num_heads, num_kv_heads)",
                   launch.heads_per_cta);
  }
  if (p.q == nullptr) return err.Null("q");
  if (p.out == nullptr) return err.Null("out");
  if (kc != nullptr && kc->new_k == nullptr) return err.Null("new_k");
  if (kc != nullptr && kc->new_v == nullptr) return err.Null("new_v");
  if (p.kv.pages == nullptr) return err.Null("kv.pages");
  if (kc != nullptr && p.kv.tails == nullptr) return err.Null("kv.tails");
  if (p.plan == nullptr) return err.Null("plan");
  if (!Aligned(p.plan, 4)) return err.Invalid("plan must be 4-byte aligned");
  if (p.batch.query_start == nullptr) return err.Null("batch.query_start");
  if (p.batch.context_len == nullptr) return err.Null("batch.context_len");
  if (p.batch.block_table == nullptr) return err.Null("batch.block_table");
  if (kc != nullptr && p.batch.tail_ids == nullptr) return err.Null("batch.tail_ids");
  if (p.batch.max_blocks_per_seq <= 0) {
    return err.Bad("batch.max_blocks_per_seq", "> 0", p.batch.max_blocks_per_seq);
  }
  c.shape = ShapeOf(p);
  const int64_t need = GpuAttentionWorkspaceBytes(c.shape, launch.num_partials);
  if (need > 0) {
    if (p.workspace == nullptr) return err.Null("workspace");
    if (!Aligned(p.workspace, 8)) return err.Invalid("workspace must be 8-byte aligned");
    if (p.workspace_bytes < need) {
      return err.Bad("workspace_bytes", "GpuAttentionWorkspaceBytes(shape, launch.num_partials)",
                     p.workspace_bytes);
    }
  }
  return absl::OkStatus();
}

// Merges read partitions: a plan with merges must have some (the last
// shared check, after the launcher's own).
inline absl::Status CheckMerges(const Errors& err, const GpuAttentionLaunch& launch) {
  if (launch.num_merges > 0 && launch.num_partials == 0) {
    return err.Bad("launch.num_partials", "> 0 with merges", launch.num_partials);
  }
  return absl::OkStatus();
}

// The skeleton's fields of the kernels' arguments, from checked params.
inline void FillArgs(const PagedAttentionParams& p, const Checked& c,
                     attention_skeleton::AttentionArgs& args) {
  args.q = p.q;
  args.out = p.out;
  args.q_stride = c.q_stride;
  args.out_stride = c.out_stride;
  args.dtype = p.dtype;
  args.kv = p.kv;
  args.batch = p.batch;
  args.num_heads = p.num_heads;
  args.group = p.num_heads / p.kv.layout.num_kv_heads;
  args.heads_per_cta = c.heads_per_cta;
  args.scale = p.scale;
  args.sliding_window = p.sliding_window;
  args.plan = p.plan;
  args.workspace = static_cast<float*>(p.workspace);
  args.slot_floats = GpuAttentionSlotFloats(c.shape);
}

}  // namespace kvserve::cuda::attention_launch
