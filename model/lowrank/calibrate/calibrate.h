// Low-rank KV calibration (`kvserve calibrate-kv`): the bases of
// model/lowrank/low_rank_kv.h from a model's own activations on text.
//
// Method: the eigenvectors of each kv-head group's activation covariance
// C over every calibration token, for x = the group's pre-RoPE K (after
// biases and k_norm) and, separately, its V; the top R are the basis and
// the mean is kept (centered PCA; `center` off: the uncentered second
// moment, and a zero mean).
// Why this and not the SVD of the projection weights whitened by the
// input activations (Palu's and SVD-LLM's W S^{1/2}): for a linear
// projection the two give the same subspace (the left singular vectors of
// W S^{1/2} are the eigenvectors of W S W^T = C), but the activation
// covariance is the group's kv width square instead of the model width
// square, needs no Cholesky of a possibly singular S, and stays exact
// where K is not linear in the input (a k_norm after the projection, as in
// Qwen3). It minimizes the mean squared reconstruction error of K and V
// themselves on the calibration text; the dropped eigenvalues' share of the
// trace is that error's share of the activations' variance, which the
// --error-budget rank choice uses.
//
// The model runs through CpuForward over an fp32 cache (teacher forcing,
// one story at a time in chunks), with a KvObserver collecting K and V.
//
// Thread-safety: none; drives the forward pass from the calling thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"
#include "model/lowrank/low_rank_kv.h"

namespace kvserve {

struct LowRankCalibrationOptions {
  // Ranks of every layer's K and V; with error_budget, the largest a layer
  // may take (0: the group's kv width).
  int32_t rank_k = 0;
  int32_t rank_v = 0;
  // > 0: each layer takes the smallest ranks whose dropped energy share is
  // at most this in every group (e.g. 0.02), capped by rank_k / rank_v.
  double error_budget = 0;
  // kv heads per latent group; 0: every kv head of a layer in one group
  // (Palu's joint decomposition, the most accurate at a given width).
  int32_t group_heads = 0;
  // Weighted PCA: K's error weighted by the queries that read it (averaged
  // over RoPE's angles), V's by the output projection. Off by default: on
  // stories260K it measured no better than plain PCA (docs/kv-low-rank.md).
  bool weighted = false;
  // Centered PCA (the default): the bases span the activations' covariance
  // and the file keeps their mean, which K's reconstruction adds back and
  // V's folds into an output bias; false: the uncentered second moment.
  bool center = true;
  int32_t chunk_tokens = 128;  // rows per forward step
  int num_threads = 0;         // <= 0: DefaultCpuThreads()
};

struct LowRankCalibration {
  LowRankKv kv;
  int64_t tokens = 0;  // calibration tokens seen
  // Per layer: the smallest share of the activations' energy the kept
  // ranks hold, over the layer's groups.
  std::vector<double> k_energy_kept;
  std::vector<double> v_energy_kept;
};

// stories: token ids (BOS first), each at most the model's context.
// InvalidArgument names the bad option (--rank-k, --rank-v, --error-budget,
// --group-heads) or says there is no text.
absl::StatusOr<LowRankCalibration> CalibrateLowRankKv(
    const LlamaWeights& weights, const std::vector<std::vector<int32_t>>& stories,
    const LowRankCalibrationOptions& options);

}  // namespace kvserve
