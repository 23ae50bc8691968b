#include "model/lowrank/calibrate/calibrate.h"

#include <algorithm>
#include <mutex>
#include <span>

#include "absl/strings/str_cat.h"
#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "cache/sizing/block_count.h"
#include "kernels/batch_input.h"
#include "model/cpu/cpu_forward.h"
#include "model/lowrank/sym_eigen.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

// Sum of x x^T per layer, group and part (K, V), in double.
class Moments {
 public:
  Moments(int layers, int groups, int width)
      : groups_(groups),
        width_(width),
        sums_(static_cast<size_t>(layers) * groups * 2,
              std::vector<double>(static_cast<size_t>(width) * width, 0.0)) {}

  void Add(int layer, int64_t rows, const float* k, const float* v) {
    const int64_t row_width = int64_t{groups_} * width_;
    std::lock_guard<std::mutex> lock(mu_);
    for (int part = 0; part < 2; ++part) {
      const float* x = part == 0 ? k : v;
      for (int g = 0; g < groups_; ++g) {
        std::vector<double>& s = sum(layer, g, part);
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * row_width + int64_t{g} * width_;
          for (int i = 0; i < width_; ++i) {  // lower triangle
            const double xi = xr[i];
            double* row = s.data() + static_cast<size_t>(i) * width_;
            for (int j = 0; j <= i; ++j) row[j] += xi * xr[j];
          }
        }
      }
    }
  }
  std::vector<double>& sum(int layer, int group, int part) {
    return sums_[(static_cast<size_t>(layer) * groups_ + group) * 2 + part];
  }

 private:
  int groups_;
  int width_;
  std::mutex mu_;
  std::vector<std::vector<double>> sums_;
};

// The share of the energy the top `rank` eigenvalues hold.
double Kept(const std::vector<double>& values, int rank) {
  double total = 0, kept = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = std::max(values[i], 0.0);
    total += v;
    if (static_cast<int>(i) < rank) kept += v;
  }
  return total > 0 ? kept / total : 1.0;
}

}  // namespace

absl::StatusOr<LowRankCalibration> CalibrateLowRankKv(
    const LlamaWeights& weights, const std::vector<std::vector<int32_t>>& stories,
    const LowRankCalibrationOptions& options) {
  const ModelConfig& c = weights.config;
  KV_RETURN_IF_ERROR(c.Validate());
  const int group_heads = options.group_heads > 0 ? options.group_heads : c.num_kv_heads;
  if (c.num_kv_heads % group_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--group-heads ", group_heads,
                                                   " does not divide the model's ", c.num_kv_heads,
                                                   " kv heads"));
  }
  const int gw = group_heads * c.head_dim, groups = c.num_kv_heads / group_heads;
  for (const auto& [rank, flag] :
       {std::pair{options.rank_k, "--rank-k"}, std::pair{options.rank_v, "--rank-v"}}) {
    if (rank < 0 || rank > gw) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", rank, " is outside [1, ", gw, "] (a group's kv width)"));
    }
    if (rank == 0 && options.error_budget <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is required (or --error-budget to choose ranks per layer)"));
    }
  }
  if (options.error_budget < 0 || options.error_budget >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--error-budget ", options.error_budget, " is outside [0, 1)"));
  }
  if (options.chunk_tokens < 1) return absl::InvalidArgumentError("chunk_tokens must be >= 1");

  KV_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> forward,
                      CpuForward::Create(weights, options.num_threads));
  Moments moments(c.num_layers, groups, gw);
  forward->set_kv_observer([&](int layer, int64_t, int64_t rows, const float* k, const float* v) {
    moments.Add(layer, rows, k, v);
  });
  constexpr int kBlockSize = 16;
  const int32_t max_len = c.max_position_embeddings;
  const int32_t blocks = BlocksForTokens(max_len, kBlockSize);
  KV_ASSIGN_OR_RETURN(KvFormat fmt,
                      KvFormat::Create(KvDtype::kFp32, c.num_kv_heads, c.head_dim, kBlockSize));
  HostKvPages pages(fmt, c.num_layers, blocks);
  BatchInput batch;
  batch.max_blocks_per_seq = blocks;
  batch.block_table.resize(blocks);
  for (int32_t i = 0; i < blocks; ++i) batch.block_table[i] = i;
  LowRankCalibration out;
  for (const std::vector<int32_t>& story : stories) {
    const int32_t n = std::min<int32_t>(static_cast<int32_t>(story.size()), max_len);
    for (int32_t begin = 0; begin < n; begin += options.chunk_tokens) {
      const int32_t end = std::min(n, begin + options.chunk_tokens);
      batch.token_ids.assign(story.begin() + begin, story.begin() + end);
      batch.positions.clear();
      batch.slot_mapping.clear();
      for (int32_t i = begin; i < end; ++i) {
        batch.positions.push_back(i);
        batch.slot_mapping.push_back(i);  // block i / bs is block id i / bs
      }
      batch.query_start.assign({0, end - begin});
      batch.context_len.assign({end});
      KV_RETURN_IF_ERROR(forward->Forward(batch, pages, {}));
    }
    out.tokens += n;
  }
  if (out.tokens == 0) return absl::InvalidArgumentError("--text: no calibration tokens");

  LowRankKv& kv = out.kv;
  kv.num_layers = c.num_layers;
  kv.dim = c.dim;
  kv.num_heads = c.num_heads;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.weights_hash = KvProjectionHash(weights);
  kv.group_heads = group_heads;
  kv.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LowRankLayer& layer = kv.layers[l];
    for (int part = 0; part < 2; ++part) {
      std::vector<SymmetricEigenResult> eig;
      for (int g = 0; g < groups; ++g) eig.push_back(SymmetricEigen(gw, moments.sum(l, g, part)));
      const int32_t cap = part == 0 ? options.rank_k : options.rank_v;
      int32_t rank = cap > 0 ? cap : gw;
      if (options.error_budget > 0) {
        for (int32_t r = 1; r <= rank; ++r) {
          bool fits = true;
          for (const SymmetricEigenResult& e : eig)
            fits &= 1 - Kept(e.values, r) <= options.error_budget;
          if (fits) {
            rank = r;
            break;
          }
        }
      }
      double kept = 1.0;
      std::vector<float>& basis = part == 0 ? layer.k_basis : layer.v_basis;
      basis.assign(static_cast<size_t>(groups) * rank * gw, 0.0f);
      for (int g = 0; g < groups; ++g) {
        kept = std::min(kept, Kept(eig[g].values, rank));
        for (int r = 0; r < rank; ++r) {
          for (int e = 0; e < gw; ++e) {
            basis[(static_cast<size_t>(g) * rank + r) * gw + e] =
                static_cast<float>(eig[g].vectors[static_cast<size_t>(r) * gw + e]);
          }
        }
      }
      (part == 0 ? layer.rank_k : layer.rank_v) = rank;
      (part == 0 ? out.k_energy_kept : out.v_energy_kept).push_back(kept);
    }
  }
  KV_RETURN_IF_ERROR(ValidateLowRankKv(kv, "calibration"));
  return out;
}

}  // namespace kvserve
