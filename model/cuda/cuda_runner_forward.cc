// CudaModelRunner: one step: the batch upload, the forward pass layer by layer,
// and the choice between a decode graph and an eager run
// (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/attention/paged_attention_kc.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/kv/kv_write.h"
#include "kernels/cuda/kv/kv_write_kc.h"
#include "kernels/cuda/layers/embedding.h"
#include "kernels/cuda/layers/fp8_rows.h"
#include "kernels/cuda/layers/gemm.h"
#include "kernels/cuda/layers/rms_norm.h"
#include "kernels/cuda/layers/rope.h"
#include "kernels/cuda/layers/swiglu.h"
#include "kernels/paged_view.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "model/batch_check.h"
#include "model/cuda/cuda_runner_impl.h"
#include "model/cuda/host/batch_staging.h"
#include "model/cuda/host/graph_buckets.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::ActDtype;
using cuda::CudaStatus;

}  // namespace

// ---- One step ----------------------------------------------------------------

absl::Status CudaModelRunner::Impl::Upload(const BatchInput& batch, std::span<const int32_t> words,
                                           const StagingLayout& layout) {
  if (layout.total_bytes > staging_capacity) {
    return absl::InternalError(absl::StrCat("batch staging: a layout of ", layout.total_bytes,
                                            " bytes exceeds the ", staging_capacity, " allocated"));
  }
  // The previous upload must have left the pinned buffer before it is reused.
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(batch_uploaded));
  KV_RETURN_IF_ERROR(FillBatchStaging(batch, words, layout,
                                      std::span<uint8_t>(staging_host.get(), staging_capacity)));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_dev.get(), staging_host.get(), layout.total_bytes,
                                          cudaMemcpyHostToDevice, stream));
  return CudaStatus(cudaEventRecord(batch_uploaded, stream), "batch upload");
}

absl::Status CudaModelRunner::Impl::RunForward(const StagingLayout& l,
                                               const GpuAttentionLaunch& launch) {
  const ModelConfig& c = config;
  const StagingShape& s = l.shape;
  const int32_t T = s.num_tokens, R = s.num_logits_rows;
  if (T == 0) return absl::OkStatus();
  uint8_t* base = staging_dev.get();
  BatchView view;
  view.token_ids = reinterpret_cast<const int32_t*>(base + l.token_ids.offset);
  view.positions = reinterpret_cast<const int32_t*>(base + l.positions.offset);
  view.slot_mapping = reinterpret_cast<const int64_t*>(base + l.slot_mapping.offset);
  view.query_start = reinterpret_cast<const int32_t*>(base + l.query_start.offset);
  view.context_len = reinterpret_cast<const int32_t*>(base + l.context_len.offset);
  view.block_table = reinterpret_cast<const int32_t*>(base + l.block_table.offset);
  view.logits_rows = reinterpret_cast<const int32_t*>(base + l.logits_rows.offset);
  view.tail_ids = reinterpret_cast<const int32_t*>(base + l.tail_ids.offset);
  view.num_tokens = T;
  view.num_seqs = s.num_seqs;
  view.max_blocks_per_seq = std::max(1, s.block_table_stride);
  view.num_logits_rows = R;
  const int32_t* plan_words = reinterpret_cast<const int32_t*>(base + l.attention.offset);
  const int64_t dim = c.dim, hid = c.hidden_dim;
  // Embedding lookups and RMSNorms of this step differ only in these
  // arguments; the rest is the step's (act, eps, stream).
  auto embedding = [&](const void* table, const int32_t* ids, void* out, int64_t vocab,
                       int64_t rows) {
    return cuda::Embedding({.table = table,
                            .ids = ids,
                            .out = out,
                            .vocab = vocab,
                            .dim = dim,
                            .num_tokens = rows,
                            .dtype = act},
                           stream);
  };
  // `rows` rows of `width` values, `stride` apart (0: width).
  auto rms_norm = [&](void* x, const void* weight, void* out, int64_t rows, int64_t width,
                      int64_t stride = 0) {
    return cuda::RmsNorm({.x = x,
                          .weight = weight,
                          .out = out,
                          .num_tokens = rows,
                          .dim = width,
                          .x_stride = stride,
                          .out_stride = stride,
                          .eps = c.rms_norm_eps,
                          .dtype = act},
                         stream);
  };
  // RoPE of the step's rows: `p` names the q (and k) columns and the
  // positions; `rows` (null: none) the host-computed cos rows then sin rows
  // ([T][head_dim / 2] each) for positions past the table.
  auto rope = [&](cuda::RopeParams p, const uint8_t* rows) {
    p.cos = reinterpret_cast<const float*>(rope_cos.get());
    p.sin = reinterpret_cast<const float*>(rope_sin.get());
    p.max_positions = c.max_position_embeddings;
    if (rows != nullptr) {
      p.row_cos = reinterpret_cast<const float*>(rows);
      p.row_sin = p.row_cos + int64_t{T} * (c.head_dim / 2);
    }
    p.num_tokens = T;
    p.num_q_heads = c.num_heads;
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.style = c.rope_style == RopeStyle::kInterleaved ? cuda::RopeStyle::kInterleaved
                                                      : cuda::RopeStyle::kNeox;
    p.dtype = act;
    return cuda::ApplyRope(p, stream);
  };

  KV_RETURN_IF_ERROR(embedding(Weight(wl.embeddings), view.token_ids, x.get(), c.vocab_size, T));

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const DeviceLayerWeights& w = wl.layers[layer];
    PagedKvView kv;
    kv.pages = kv_pool.get() + pool_shape.layer_offset[layer];
    kv.num_blocks = num_blocks;
    kv.layout = formats[layer].layout();
    const bool kc = kv.layout.has_tails();  // int4_kc: seal, attention, tails
    if (kc) {
      kv.tails = kv_pool.get() + pool_shape.tail_offset[layer];
      kv.num_tails = num_tails;
    }
    cuda::KvKcWriteParams kcw;
    kcw.k = Act(qkv, q_dim);
    kcw.v = Act(qkv, q_dim + kv_dim);
    kcw.k_stride = qkv_dim;
    kcw.v_stride = qkv_dim;
    kcw.dtype = act;
    kcw.batch = view;
    kcw.kv = kv;

    KV_RETURN_IF_ERROR(rms_norm(x.get(), Weight(w.attn_norm), h.get(), T, dim));
    KV_RETURN_IF_ERROR(Linear({.x = h.get(),
                               .w = Weight(w.wqkv),
                               .y = qkv.get(),
                               .rows = T,
                               .in = dim,
                               .out = qkv_dim,
                               .bias = c.qkv_bias ? Weight(w.bqkv) : nullptr,
                               .y_dtype = act},
                              w.wqkv));

    if (c.qk_norm) {
      // Every q and k head of every row is one RMSNorm row of head_dim
      // values: one launch (per-head form), q_norm for the q heads.
      KV_RETURN_IF_ERROR(cuda::RmsNorm({.x = qkv.get(),
                                        .weight = Weight(w.q_norm),
                                        .out = qkv.get(),
                                        .num_tokens = T,
                                        .dim = c.head_dim,
                                        .x_stride = qkv_dim,
                                        .out_stride = qkv_dim,
                                        .eps = c.rms_norm_eps,
                                        .dtype = act,
                                        .heads = c.num_heads + c.num_kv_heads,
                                        .weight2 = Weight(w.k_norm),
                                        .weight2_from = c.num_heads},
                                       stream));
    }
    const uint8_t* ev_base = ev.active ? ev_dev.get() : nullptr;
    if (ev.active && ev.sinks) {
      // The sink query: the same q rotated at the row's cache index (its
      // in-cache position), kept at q's stride.
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(sink_q.get(), qkv_dim * elem, qkv.get(),
                                                qkv_dim * elem, q_dim * elem, T,
                                                cudaMemcpyDeviceToDevice, stream));
      KV_RETURN_IF_ERROR(
          rope({.q = sink_q.get(),
                .q_stride = qkv_dim,
                .positions = reinterpret_cast<const int32_t*>(ev_base + ev.sink_pos_off)},
               ev.sink_rope_rows ? ev_base + ev.sink_rope_off : nullptr));
    }
    KV_RETURN_IF_ERROR(rope({.q = qkv.get(),
                             .k = Act(qkv, q_dim),
                             .q_stride = qkv_dim,
                             .k_stride = qkv_dim,
                             .positions = view.positions},
                            ev.active && ev.rope_rows ? ev_base + ev.rope_off : nullptr));

    cuda::KvWriteParams kw;
    kw.k = Act(qkv, q_dim);
    kw.v = Act(qkv, q_dim + kv_dim);
    kw.k_stride = qkv_dim;
    kw.v_stride = qkv_dim;
    kw.slot_mapping = view.slot_mapping;
    kw.num_tokens = T;
    kw.kv = kv;
    kw.dtype = act;
    KV_RETURN_IF_ERROR(kc ? cuda::SealKvBlocks(kcw, stream) : cuda::WriteKv(kw, stream));

    cuda::PagedAttentionParams pa;
    pa.q = qkv.get();
    pa.out = attn.get();
    pa.q_stride = qkv_dim;
    pa.out_stride = q_dim;
    pa.dtype = act;
    pa.kv = kv;
    pa.batch = view;
    pa.num_heads = c.num_heads;
    pa.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    pa.sliding_window = c.sliding_window;
    pa.plan = plan_words;
    pa.launch = launch;
    pa.workspace = attn_workspace.get();
    pa.workspace_bytes = attn_workspace_bytes;
    pa.kernel = options.attention_kernel == "reference" ? cuda::AttentionKernel::kReference
                                                        : cuda::AttentionKernel::kFast;
    pa.num_sms = num_sms;  // a persistent grid: decode graphs sized for capacities stay small
    if (kc) {
      const cuda::PagedAttentionKcParams pk{.attn = pa,
                                            .new_k = kcw.k,
                                            .new_v = kcw.v,
                                            .new_k_stride = qkv_dim,
                                            .new_v_stride = qkv_dim};
      KV_RETURN_IF_ERROR(cuda::PagedAttentionKc(pk, stream));
      KV_RETURN_IF_ERROR(cuda::WriteKvTails(kcw, stream));
    } else {
      // Eviction (sinks, attention mass) only reaches per-token formats:
      // supports_eviction() is false when any layer is int4_kc.
      if (ev.active && ev.sinks) {
        pa.sink_q = sink_q.get();
        pa.num_sinks = reinterpret_cast<const int32_t*>(ev_base + ev.num_sinks_off);
      }
      if (ev.active && ev.mass) {
        pa.key_mass = reinterpret_cast<float*>(key_mass.get());
        pa.key_mass_offset = reinterpret_cast<const int64_t*>(ev_base + ev.mass_offset_off);
        pa.softmax_stats = reinterpret_cast<float*>(softmax_stats.get());
      }
      KV_RETURN_IF_ERROR(cuda::PagedAttention(pa, stream));
      if (ev.active && ev.mass) {
        cuda::GatherMassParams g;
        g.batch = view;
        g.sliding_window = c.sliding_window;
        g.key_mass = pa.key_mass;
        g.key_mass_offset = pa.key_mass_offset;
        g.stats_offset = reinterpret_cast<const int64_t*>(ev_base + ev.stats_offset_off) +
                         int64_t{layer} * s.num_seqs;
        g.out = reinterpret_cast<float*>(attn_stats.get());
        KV_RETURN_IF_ERROR(cuda::GatherAttentionMass(g, stream));
      }
    }

    KV_RETURN_IF_ERROR(Linear({.x = attn.get(),
                               .w = Weight(w.wo),
                               .y = x.get(),
                               .rows = T,
                               .in = q_dim,
                               .out = dim,
                               .accumulate = true,
                               .bias = c.o_bias ? Weight(w.bo) : nullptr,
                               .y_dtype = act},
                              w.wo));
    KV_RETURN_IF_ERROR(rms_norm(x.get(), Weight(w.ffn_norm), h.get(), T, dim));
    KV_RETURN_IF_ERROR(Linear({.x = h.get(),
                               .w = Weight(w.w_gate_up),
                               .y = gate_up.get(),
                               .rows = T,
                               .in = dim,
                               .out = 2 * hid,
                               .y_dtype = act},
                              w.w_gate_up));

    cuda::SwiGluParams sw;
    sw.gate_up = gate_up.get();
    sw.out = gate_up.get();  // in place: row t's first `hidden` values
    sw.num_tokens = T;
    sw.hidden = hid;
    sw.gate_up_stride = 2 * hid;
    sw.out_stride = 2 * hid;
    sw.dtype = act;
    KV_RETURN_IF_ERROR(cuda::SwiGlu(sw, stream));

    KV_RETURN_IF_ERROR(Linear({.x = gate_up.get(),
                               .w = Weight(w.w_down),
                               .y = x.get(),
                               .rows = T,
                               .in = hid,
                               .out = dim,
                               .ldx = 2 * hid,
                               .accumulate = true,
                               .y_dtype = act},
                              w.w_down));
  }

  if (R == 0) return absl::OkStatus();
  // The logits rows of the residual stream, gathered (an embedding lookup
  // whose table is x), normed and multiplied by the head.
  KV_RETURN_IF_ERROR(embedding(x.get(), view.logits_rows, final_rows.get(), T, R));
  KV_RETURN_IF_ERROR(rms_norm(final_rows.get(), Weight(wl.final_norm), final_rows.get(), R, dim));
  return Linear({.x = final_rows.get(),
                 .w = Weight(wl.lm_head),
                 .y = logits.get(),
                 .rows = R,
                 .in = dim,
                 .out = c.vocab_size,
                 .y_dtype = ActDtype::kFp32},
                wl.lm_head);
}

absl::Status CudaModelRunner::Impl::Linear(cuda::GemmParams p, const DeviceMatrix& w) {
  if (w.fp8()) {
    KV_RETURN_IF_ERROR(cuda::QuantizeRowsFp8({.x = p.x,
                                              .q = act_q.get(),
                                              .scale = reinterpret_cast<float*>(act_scale.get()),
                                              .rows = p.rows,
                                              .cols = p.in,
                                              .ldx = p.ldx,
                                              .ldq = w.ld,
                                              .dtype = act},
                                             stream));
    p.x = act_q.get();
    p.in = w.ld;
    p.ldx = w.ld;
    p.w_scale = reinterpret_cast<const float*>(weights.get() + w.scale_offset);
    p.x_scale = reinterpret_cast<const float*>(act_scale.get());
  }
  return gemm->Linear(p, stream);
}

absl::Status CudaModelRunner::Impl::ForwardBatch(const BatchInput& batch) {
  last_logits_rows = -1;
  ev = Eviction();
  BatchLimits limits;
  limits.vocab_size = config.vocab_size;
  // Positions past the RoPE table (sequences that evict) get host-computed
  // cos/sin rows (PlanEviction).
  limits.max_positions = std::numeric_limits<int32_t>::max();
  limits.num_blocks = num_blocks;
  limits.block_size = format.block_size();
  limits.num_tails = num_tails;
  limits.sliding_window = config.sliding_window;
  KV_RETURN_IF_ERROR(ValidateBatch(batch, limits));
  const int32_t T = batch.num_tokens(), B = batch.num_seqs();
  const int32_t R = static_cast<int32_t>(batch.logits_rows.size());
  auto too_big = [](const char* what, int64_t have, int64_t most, const char* key) {
    return absl::InvalidArgumentError(absl::StrCat("BatchInput: ", what, " is ", have,
                                                   "; the CUDA runner was sized for ", most, " (",
                                                   key, ")"));
  };
  if (T > max_tokens) {
    return too_big("num_tokens", T, max_tokens, "scheduler.max_num_batched_tokens");
  }
  if (B > max_seqs) return too_big("num_seqs", B, max_seqs, "scheduler.max_num_seqs");
  if (R > max_logits_rows) {
    return too_big("the logits row count", R, max_logits_rows, "scheduler.max_num_seqs");
  }
  if (batch.max_blocks_per_seq > max_blocks_per_seq) {
    return too_big("max_blocks_per_seq", batch.max_blocks_per_seq, max_blocks_per_seq,
                   "scheduler.max_model_len");
  }
  if (T == 0) {
    last_logits_rows = 0;
    return absl::OkStatus();
  }
  KV_RETURN_IF_ERROR(PlanEviction(batch));
  const GraphStep* graph = nullptr;
  if (!graphs.empty() && !ev.active && IsPureDecode(batch)) {
    if (auto it = graphs.find(GraphBucketFor(buckets, B)); it != graphs.end()) {
      graph = &it->second;
    }
  }
  KV_ASSIGN_OR_RETURN(
      GpuAttentionPlan plan,
      PlanGpuAttention(ViewOf(batch), attn_shape, graph ? graph->options : eager_options));
  if (graph != nullptr) {
    KV_RETURN_IF_ERROR(Upload(batch, plan.words(), graph->layout));
    KV_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->exec, stream));
    ++counters.graph_steps;
  } else {
    const StagingLayout layout =
        PlanStaging(ShapeOfBatch(batch, static_cast<int32_t>(plan.words().size())));
    KV_RETURN_IF_ERROR(Upload(batch, plan.words(), layout));
    KV_RETURN_IF_ERROR(RunForward(layout, plan.launch()));
    ++counters.eager_steps;
  }
  last_logits_rows = R;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Forward(const BatchInput& batch) {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return impl_->ForwardBatch(batch);
}

}  // namespace kvserve
