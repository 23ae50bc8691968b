// LowRankKv: a model's low-rank KV projection (Palu, ICLR 2025; training
// free): per layer and per group of kv heads, an orthonormal basis of the
// group's pre-RoPE K and of its V, so that the cache stores rank-R latents
// instead of the heads' values. `kvserve calibrate-kv` computes it
// (model/lowrank/calibrate.h) and writes it beside the model;
// `cache.low_rank: FILE` makes the CPU runner use it (docs/kv-low-rank.md).
//
// Shapes: a group is group_heads consecutive kv heads, group_width =
// group_heads * head_dim values per token; num_groups = num_kv_heads /
// group_heads. Layer l keeps, per group g, for K (r < rank_k) and V
// (r < rank_v), e < group_width:
//   mean    m[g][e]
//   encoder E[g][r][e]: latent z_r = sum_e E[r][e] (x[e] - m[e])
//   basis   D[g][r][e]: reconstruction x ~ m + sum_r z_r D[r]
// (E = D with orthonormal rows for plain PCA; the calibration's weighted
// PCA makes them differ, model/lowrank/calibrate/calibrate.h).
// The cache stores, per group and token, the latent c = [z_k | z_v | 0 pad]
// of rank_k + rank_v values split in two halves of stored_width() =
// ceil((rank_k + rank_v) / 2) rounded up to even: the page's K row holds
// c[0, W), its V row c[W, 2W), in the layer's KV format. A page layout has
// one width for K and V; this way the two ranks may differ (K is far more
// compressible than V) and the bytes follow their sum.
//
// The file (little-endian, version 1):
//   "KVSLOWRK"  magic, 8 bytes
//   u32 version
//   u32 num_layers, dim, num_heads, num_kv_heads, head_dim, group_heads
//   u64 the K/V projection weights' hash (KvProjectionHash)
//   u32 rank_k, rank_v                       per layer
//   f32 k_basis, k_encoder [G][rank_k][W], v_basis, v_encoder [G][rank_v][W],
//       k_mean, v_mean [G][W]                per layer
//   u64 FNV-1a 64 of every byte before it
// Loading refuses a file of another model (shape or weights hash), a
// truncated one and one whose checksum does not match, naming the file and
// what is wrong.
//
// Thread-safety: immutable once loaded; shared by runners read-only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/sizing/kv_layers.h"
#include "model/llama_weights.h"

namespace kvserve {

struct LowRankLayer {
  int32_t rank_k = 0;
  int32_t rank_v = 0;
  std::vector<float> k_basis;    // [num_groups][rank_k][group_width], decodes
  std::vector<float> k_encoder;  // [num_groups][rank_k][group_width]
  std::vector<float> v_basis;    // [num_groups][rank_v][group_width], decodes
  std::vector<float> v_encoder;  // [num_groups][rank_v][group_width]
  std::vector<float> k_mean;     // [num_groups][group_width] (zeros: uncentered)
  std::vector<float> v_mean;     // [num_groups][group_width]

  // Values per group and token in each of the page's K and V rows: half
  // of rank_k + rank_v, rounded up to even (every KV format takes even
  // widths).
  int32_t stored_width() const {
    const int32_t half = (rank_k + rank_v + 1) / 2;
    return (half + 1) / 2 * 2;
  }
};

struct LowRankKv {
  // The model it was calibrated on.
  int32_t num_layers = 0;
  int32_t dim = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  uint64_t weights_hash = 0;
  int32_t group_heads = 0;  // kv heads per group
  std::vector<LowRankLayer> layers;

  int32_t num_groups() const { return group_heads > 0 ? num_kv_heads / group_heads : 0; }
  int32_t group_width() const { return group_heads * head_dim; }
  // The kv width of one layer (num_kv_heads * head_dim).
  int32_t kv_width() const { return num_kv_heads * head_dim; }
};

inline constexpr uint32_t kLowRankFileVersion = 1;

// FNV-1a 64 over bytes, continuing from `seed` (the file's checksum).
uint64_t Fnv1a64(std::span<const uint8_t> bytes, uint64_t seed = 0xcbf29ce484222325ull);

// A hash of every layer's K/V projection (wk, wv, and bk, bv, k_norm where
// the model has them): what the bases were computed from.
uint64_t KvProjectionHash(const LlamaWeights& weights);

// Structural checks (shapes, ranks in [1, group_width], basis sizes);
// InvalidArgument naming `what` (e.g. the file).
absl::Status ValidateLowRankKv(const LowRankKv& kv, const std::string& what);

// Whether `kv` was calibrated on this model: the shape and the K/V weights
// hash; FailedPrecondition naming `what` and both sides otherwise.
absl::Status CheckLowRankMatches(const LowRankKv& kv, const LlamaWeights& weights,
                                 const std::string& what);

// Every layer's page shape (the groups at the stored width), for
// ResolveKvLayers: the pool's bytes per block follow the ranks.
std::vector<KvLayerDims> LowRankLayerDims(const LowRankKv& kv);

absl::Status SaveLowRankKv(const LowRankKv& kv, const std::string& path);

// Reads and checks a file written by SaveLowRankKv (magic, version, sizes,
// checksum, structure). Errors start with "low-rank file PATH: ".
absl::StatusOr<LowRankKv> LoadLowRankKv(const std::string& path);
// LoadLowRankKv, then CheckLowRankMatches against `weights`.
absl::StatusOr<LowRankKv> LoadLowRankKvFor(const std::string& path, const LlamaWeights& weights);

}  // namespace kvserve
