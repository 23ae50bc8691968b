// CpuForward: the Llama-family forward pass on the CPU over one flattened
// BatchInput (prefill chunks and decode tokens of many sequences together),
// reading and writing K/V only through the paged cache it is given. It is
// the compute half of CpuModelRunner, which owns the KV pools; the weights
// and their loading live in model/llama_weights.h and the loaders.
//
// Per layer: RMSNorm -> Q/K/V projections (+ biases: Qwen2) -> per-head q/k
// RMSNorm (Qwen3) -> RoPE at batch.positions (scaled per the config;
// positions past the RoPE table are computed the same way, so sequences that
// evict may run past max_position_embeddings) ->
// WriteKv at batch.slot_mapping -> PagedAttention (GQA, optional sliding
// window) -> output projection (+ bias) + residual -> RMSNorm -> SwiGLU MLP +
// residual. Then the final RMSNorm and the output head, only for the rows in
// batch.logits_rows.
//
// Activations are preallocated for the largest batch seen so far, so a
// steady decode loop allocates nothing. Work is split over the thread pool
// only when a step is big enough to pay for the hand-off (kParallelMinMacs;
// never for one decoding sequence of a tiny model), in one of two ways:
//   * many rows (at least kMinRowsPerThread per thread: prefill, big decode
//     batches), or a few rows of a small model: one row range per thread
//     for the projections and the MLP, each range streaming the weights
//     once, two phases per layer;
//   * few rows of a big model (decode of one or a few sequences, where
//     streaming the weights is the cost; kMinColumnPhaseMacs): every
//     matrix is split over its output features
//     (kColumnChunksPerThread ranges per thread), so each thread reads only
//     its share of the weights; the per-row ops between the matrices run on
//     the calling thread, and a layer takes four phases (Q/K/V, output
//     projection, gate/up, down).
// Attention is split into ranges of rows balanced by context length, the
// output head into vocabulary ranges. Every kernel computes an element the
// same way whatever batch or range it is in (see kernels/cpu/layers/gemm.h), so a
// sequence's tokens depend neither on what it is batched with, nor on the
// thread count, nor on which split a step took.
//
// KV eviction (cache/eviction/eviction_policy.h): rows of sequences with
// batch.num_sinks also get a sink query, rotated at the row's cache index,
// for the attention kernel to score sink keys with; for sequences with
// batch.attention_stats the kernel records each row's per-key attention
// mass, which is summed per sequence and layer after each layer's attention
// (attention_stats()).
//
// Quantized weights (weights.quantized: model.weight_dtype int8 / int4)
// replace the fp32 matrices they cover with cpu::QuantLinear, which splits
// over output features in blocks of cpu::kQuantBlock; every path above
// stays as it is, and a row's result is still the same bits whatever the
// batch, split or thread count.
//
// Matrices that are not 64-byte aligned (an mmap of a llama2.c file starts
// them 28 bytes in) are copied once into an aligned arena when the model is
// small enough (kMaxRepackBytes); the aligned loads make decode of tiny
// models about a fifth faster.
//
// Low-rank KV (cache.low_rank; model/lowrank/low_rank_kv.h): the pages of
// layer l hold, per group of kv heads, rank-R latents of the pre-RoPE K and
// of V (format: the groups as kv heads, the stored width as head_dim).
// FinishQkv projects K and V onto the bases before RoPE and writes the
// latents; cpu::LowRankAttention reconstructs and rotates the keys and
// returns each head's V latent, which the output projection takes through
// W_o' = B_v^T W_o (per head, computed at Create), plus W_o times V's mean. Eviction (sinks, key
// mass) is refused for these pages, and a row's position must be its cache
// index (keys are rotated at their index).
//
// Cross-layer KV (cache.cross_layer; cache/format/kv_cross_layer.h and
// kernels/cpu/attention/cross_layer_attention.h): the pages of a pair's base
// and shared layer are written when a block fills (CrossLayerFlush at the
// shared layer, before its attention, from both layers' tails and this
// step's rows; the base layer's rows of the step are kept until then), and
// both layers attend with cpu::CrossLayerAttention and write their partial
// block's rows into tails after it. A step in which a sequence's rows cross
// a block boundary runs as rounds, one block of each sequence per round, so
// every block below a row's own one is merged before the row's base layer
// attends: what a row sees then depends on its cache index only (prefix
// hits, chunking and recompute give the same tokens). Eviction (sinks, key
// mass) is refused with these pages.
//
// Thread-safety: none; one engine thread calls Forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/format/kv_cross_layer.h"
#include "cache/format/kv_pages.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/layers/ops.h"
#include "kernels/cpu/quant/quant_matrix.h"
#include "kernels/cpu/thread_pool.h"
#include "model/llama_weights.h"
#include "model/lowrank/low_rank_kv.h"

namespace kvserve {

class CpuForward {
 public:
  // num_threads counts the calling thread; <= 0 means DefaultCpuThreads()
  // (what the cgroup CPU quota and the affinity mask allow).
  // low_rank (optional): latents instead of K/V; its shape must be the
  // model's (CheckLowRankMatches is the caller's, at load).
  // cross_layer (optional): its pairs' pages must be the formats
  // ResolveKvLayers gives for it (checked each step).
  static absl::StatusOr<std::unique_ptr<CpuForward>> Create(
      LlamaWeights weights, int num_threads, std::shared_ptr<const LowRankKv> low_rank = nullptr,
      const KvCrossLayerSpec& cross_layer = {});

  // Sees every row's Q, K and V after biases and q/k norms, before RoPE
  // (layer, first row, rows, q [rows][q_dim], k, v [rows][kv_dim]): the
  // low-rank calibration's activations. Called from the pool's threads on
  // disjoint row ranges of a layer, so it must be thread-safe.
  using KvObserver = std::function<void(int layer, int64_t row0, int64_t rows, const float* q,
                                        const float* k, const float* v)>;
  void set_kv_observer(KvObserver observer) { kv_observer_ = std::move(observer); }
  const LowRankKv* low_rank() const { return low_rank_.get(); }
  const KvCrossLayerSpec& cross_layer() const { return cross_; }

  const ModelConfig& config() const { return weights_.config; }
  const LlamaWeights& weights() const { return weights_; }
  int num_threads() const { return pool_.num_threads(); }

  // Runs one step. kv must have config().num_layers layers whose format
  // matches the model's kv heads and head_dim. Fills logits[i * vocab ..]
  // for row batch.logits_rows[i]. InvalidArgument names a malformed batch
  // field (sizes, token ids, positions, slots, block ids) before any K/V is
  // written.
  absl::Status Forward(const BatchInput& batch, HostKvPages& kv, std::span<float> logits);

  // The last Forward's attention statistics: for each sequence b with
  // batch.attention_stats[b] set, in batch order, [num_layers][context_len[b]]
  // (see ModelRunner::ReadAttentionStats).
  std::span<const float> attention_stats() const { return attn_stats_; }

  // A step estimated below this many multiply-adds (weights x rows plus
  // attention) runs on one thread: about 50 us of work, against a few
  // microseconds of hand-offs per layer.
  static constexpr int64_t kParallelMinMacs = int64_t{1} << 20;
  // Rows per thread from which a step splits rows rather than output
  // features: from there on the matrix kernels are compute-bound, and a
  // row split needs fewer phases.
  static constexpr int kMinRowsPerThread = 16;
  // Output-feature ranges per thread in a split over features, so that a
  // thread the OS runs late leaves its ranges to the others.
  static constexpr int kColumnChunksPerThread = 4;
  // Fewer multiply-adds than this per phase of a split over features (a
  // layer has four) and a step splits rows instead, or, for one row, runs on
  // one thread: a tiny model's phases would cost more in hand-offs than
  // they save.
  static constexpr int64_t kMinColumnPhaseMacs = int64_t{1} << 20;
  // Attention ranges per thread (cost estimates are rough; claiming evens out).
  static constexpr int kAttentionChunksPerThread = 4;
  // Largest total of matrices copied for alignment.
  static constexpr int64_t kMaxRepackBytes = int64_t{256} << 20;

 private:
  CpuForward(LlamaWeights weights, int num_threads, std::shared_ptr<const LowRankKv> low_rank,
             const KvCrossLayerSpec& cross_layer);
  // Cross layer: the pages' roles and what the batch may ask of them.
  absl::Status ValidateCrossLayer(const BatchInput& batch, const HostKvPages& kv) const;
  // Cross layer: runs a step whose sequences cross block boundaries as one
  // round per block (false: one round is enough, nothing ran).
  absl::StatusOr<bool> ForwardInRounds(const BatchInput& batch, HostKvPages& kv,
                                       std::span<float> logits);
  // Layer l's part in cross-layer sharing, as its pages say.
  KvCrossRole RoleOf(const HostKvPages& kv, int layer) const {
    return kv.format(layer).cross_role();
  }
  void RepackIfMisaligned();
  // W_o' per layer and the latent widths (low rank only).
  void FoldLowRank();
  // Projects rows [r0, r1) of k_ / v_ (pre-RoPE) onto layer l's bases.
  void ProjectLatents(int layer, int64_t r0, int64_t r1);
  // Input width of layer l's output projection.
  int64_t AttentionWidth(int layer) const {
    return low_rank_ ? int64_t{weights_.config.num_heads} * low_rank_->layers[layer].rank_v
                     : q_dim_;
  }

  absl::Status Validate(const BatchInput& batch, const HostKvPages& kv,
                        std::span<float> logits) const;
  // The low-rank pages' shapes and what the batch may ask of them.
  absl::Status ValidateLowRank(const BatchInput& batch, const HostKvPages& kv) const;
  void EnsureCapacity(int64_t rows, int64_t logit_rows);
  // Decides how the step splits work (split_rows_, row_chunks_,
  // col_chunks_) and splits the attention rows into ranges of about equal
  // cost (attn_split_).
  void PlanStep(const BatchInput& batch);
  // Rows that need a sink query and rows whose key mass is recorded.
  void PlanEviction(const BatchInput& batch);
  // cos/sin of position pos: the table's row, or computed the same way into
  // the scratch past the table.
  void RopeAt(int32_t pos, float* scratch, const float** cos, const float** sin) const;
  // Adds layer l's recorded row masses into attn_stats_.
  void GatherAttentionStats(const BatchInput& batch, int layer);

  // Steps of one layer over rows [r0, r1) and, for the matrices, output
  // features [c0, c1) (of q|k|v concatenated for Qkv).
  void NormAttention(int layer, int64_t r0, int64_t r1);
  void Qkv(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
  // Biases, q/k norms, RoPE, sink queries and the K/V write.
  void FinishQkv(int layer, const BatchInput& batch, HostKvPages& kv, int64_t r0, int64_t r1);
  void AttentionOutput(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
  void NormMlp(int layer, int64_t r0, int64_t r1);
  void GateUp(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
  void Down(int layer, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
  // A split over rows: the steps of a phase for one row range.
  void AttentionInput(int layer, const BatchInput& batch, HostKvPages& kv, int64_t r0, int64_t r1);
  void AttentionOutputAndMlp(int layer, int64_t r0, int64_t r1);
  // Runs fn(c0, c1) over [0, cols) in col_chunks_ ranges of whole granules.
  template <typename Fn>
  void RunColumns(int64_t cols, Fn&& fn);

  // A matrix the forward pass reads: fp32 (the weights' own, or an aligned
  // copy) or quantized.
  struct Matrix {
    const float* f = nullptr;             // [out][in]
    const cpu::QuantMatrix* q = nullptr;  // set: use it instead of f
  };
  struct LayerMatrices {
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  // y[r * ldy + (o - c0)] (+)= x[r] . m[o] for outputs [c0, c1), rows [0, rows).
  static void MatMul(const float* x, int64_t rows, int64_t in, const Matrix& m, int64_t c0,
                     int64_t c1, float* y, int64_t ldy, bool accumulate);
  struct FreeDeleter {
    void operator()(float* p) const;
  };

  LlamaWeights weights_;
  std::vector<LayerMatrices> mats_;
  Matrix output_;                              // [vocab][dim]
  int64_t granule_ = 8;                        // outputs a column split keeps together
  std::unique_ptr<float, FreeDeleter> arena_;  // aligned copies, when made
  cpu::RopeTable rope_;
  std::vector<float> inv_freq_;  // [head_dim / 2], what the table was built from
  cpu::ThreadPool pool_;
  int q_dim_ = 0;   // num_heads * head_dim
  int kv_dim_ = 0;  // num_kv_heads * head_dim
  float attn_scale_ = 0.0f;

  // Activations, [capacity rows][width]; grown, never shrunk.
  int64_t capacity_ = 0;
  int64_t logit_capacity_ = 0;
  std::vector<float> x_;             // residual stream [T][dim]
  std::vector<float> xb_;            // normed input [T][dim]
  std::vector<float> q_;             // [T][q_dim]
  std::vector<float> k_;             // [T][kv_dim]
  std::vector<float> v_;             // [T][kv_dim]
  std::vector<float> att_;           // attention output [T][q_dim]
  std::vector<float> gate_;          // [T][hidden_dim]
  std::vector<float> up_;            // [T][hidden_dim]
  std::vector<float> final_;         // normed rows that want logits [R][dim]
  int64_t macs_per_token_ = 0;       // weight multiply-adds of one row
  bool split_rows_ = true;           // this step splits rows, not output features
  int row_chunks_ = 1;               // row ranges of the projections / MLP
  int col_chunks_ = 1;               // output-feature ranges of a matrix
  std::vector<int32_t> attn_split_;  // [attention ranges + 1] row boundaries

  // Low rank (null / empty without).
  std::shared_ptr<const LowRankKv> low_rank_;
  std::vector<std::vector<float>> wo_low_rank_;  // [layer][dim][num_heads * rank_v]
  std::vector<std::vector<float>> bo_low_rank_;  // [layer][dim]: W_o times V's mean
  int64_t att_width_ = 0;                        // max AttentionWidth
  int64_t latent_width_ = 0;                     // max groups * stored width
  std::vector<float> k_lat_;                     // [T][groups][stored width]
  std::vector<float> v_lat_;                     // [T][groups][stored width]
  KvObserver kv_observer_;

  // Cross layer (off: from_layer -1): a base layer's rows of the step, kept
  // for its shared layer's flush.
  KvCrossLayerSpec cross_;
  std::vector<float> base_k_;  // [T][kv_dim]
  std::vector<float> base_v_;  // [T][kv_dim]
  BatchInput round_;           // ForwardInRounds' current round
  std::vector<float> round_logits_;

  // Eviction, per step (empty unless the batch asks).
  std::vector<int32_t> sink_pos_;      // [T]: cache index for a sink query, or -1
  std::vector<float> sink_q_;          // [T][q_dim]
  std::vector<int64_t> mass_offset_;   // [T]: into row_mass_, or -1
  std::vector<float> row_mass_;        // [recorded rows' keys]
  std::vector<int64_t> stats_offset_;  // [B]: into attn_stats_, or -1
  std::vector<float> attn_stats_;      // see attention_stats()
};

}  // namespace kvserve
