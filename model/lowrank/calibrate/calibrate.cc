#include "model/lowrank/calibrate/calibrate.h"

#include <algorithm>
#include <cmath>
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

// The metrics' ridge, as a share of their mean diagonal: keeps M^-1/2
// bounded where a direction never reaches the output.
constexpr double kMetricRidge = 1e-3;

// Sum of x x^T per layer, group and part (K, V), in double.
class Moments {
 public:
  Moments(int layers, int groups, int width)
      : groups_(groups),
        width_(width),
        sums_(static_cast<size_t>(layers) * groups * 2,
              std::vector<double>(static_cast<size_t>(width) * width, 0.0)),
        lin_(sums_.size(), std::vector<double>(width, 0.0)),
        count_(layers, 0) {}

  // q_moments: [layers][q_dim], the sum of every query channel's square.
  void Add(int layer, int64_t rows, const float* q, int q_dim, const float* k, const float* v) {
    const int64_t row_width = int64_t{groups_} * width_;
    std::lock_guard<std::mutex> lock(mu_);
    if (q_sums_.empty()) q_sums_.assign(sums_.size() / (2 * groups_), std::vector<double>(q_dim));
    for (int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < q_dim; ++c) {
        const double x = q[r * q_dim + c];
        q_sums_[layer][c] += x * x;
      }
    }
    count_[layer] += rows;
    for (int part = 0; part < 2; ++part) {
      const float* x = part == 0 ? k : v;
      for (int g = 0; g < groups_; ++g) {
        std::vector<double>& s = sum(layer, g, part);
        std::vector<double>& lin = lin_[(static_cast<size_t>(layer) * groups_ + g) * 2 + part];
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * row_width + int64_t{g} * width_;
          for (int i = 0; i < width_; ++i) lin[i] += xr[i];
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
  const std::vector<double>& q_sum(int layer) const { return q_sums_[layer]; }
  // The mean of a group's K (part 0) or V over the tokens seen.
  std::vector<double> mean(int layer, int group, int part) const {
    std::vector<double> m = lin_[(static_cast<size_t>(layer) * groups_ + group) * 2 + part];
    for (double& x : m) x /= std::max<int64_t>(count_[layer], 1);
    return m;
  }
  int64_t count(int layer) const { return count_[layer]; }

 private:
  int groups_;
  int width_;
  std::mutex mu_;
  std::vector<std::vector<double>> sums_;
  std::vector<std::vector<double>> q_sums_;
  std::vector<std::vector<double>> lin_;  // sum of x per layer, group, part
  std::vector<int64_t> count_;            // tokens per layer
};

// f(M) = sum_i f(lambda_i) m_i m_i^T for a symmetric M [n][n].
std::vector<double> MatrixFunction(int n, const std::vector<double>& m, double (*f)(double)) {
  const SymmetricEigenResult e = SymmetricEigen(n, m);
  std::vector<double> out(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    const double fl = f(std::max(e.values[i], 0.0));
    const double* v = e.vectors.data() + static_cast<size_t>(i) * n;
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) out[static_cast<size_t>(a) * n + b] += fl * v[a] * v[b];
    }
  }
  return out;
}

// a b for [n][n] matrices.
std::vector<double> MatMul(int n, const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      const double x = a[static_cast<size_t>(i) * n + k];
      for (int j = 0; j < n; ++j)
        out[static_cast<size_t>(i) * n + j] += x * b[static_cast<size_t>(k) * n + j];
    }
  }
  return out;
}

// Adds ridge * mean diagonal to the diagonal (the metric must be invertible).
void Ridge(int n, std::vector<double>& m, double ridge) {
  double trace = 0;
  for (int i = 0; i < n; ++i) trace += m[static_cast<size_t>(i) * n + i];
  const double add = ridge * std::max(trace / n, 1e-30);
  for (int i = 0; i < n; ++i) m[static_cast<size_t>(i) * n + i] += add;
}

// The metric of a group's K error: the attention logit error of a pre-RoPE
// key error e is q_rot . R(j) e; averaged over the rotation angles, RoPE
// mixes each channel pair evenly, so the metric is diagonal with channel
// c's weight the mean of E[q_c^2] and E[q_pair(c)^2], summed over the query
// heads that read the kv head.
std::vector<double> KeyMetric(const ModelConfig& c, const std::vector<double>& q_sum, int group,
                              int group_heads) {
  const int hd = c.head_dim, gw = group_heads * hd, q_per_kv = c.num_heads / c.num_kv_heads;
  std::vector<double> m(static_cast<size_t>(gw) * gw, 0.0);
  const bool interleaved = c.rope_style == RopeStyle::kInterleaved;
  for (int i = 0; i < group_heads; ++i) {
    const int kvh = group * group_heads + i;
    for (int e = 0; e < hd; ++e) {
      const int pair = interleaved ? (e ^ 1) : (e < hd / 2 ? e + hd / 2 : e - hd / 2);
      double w = 0;
      for (int h = kvh * q_per_kv; h < (kvh + 1) * q_per_kv; ++h) {
        w += 0.5 *
             (q_sum[static_cast<size_t>(h) * hd + e] + q_sum[static_cast<size_t>(h) * hd + pair]);
      }
      m[static_cast<size_t>(i * hd + e) * gw + i * hd + e] = w;
    }
  }
  return m;
}

// The metric of a group's V error: what it does to the output, sum over the
// query heads h of kv head kvh of Wo_h^T Wo_h (block diagonal over kv heads).
std::vector<double> ValueMetric(const ModelConfig& c, const float* wo, int group, int group_heads) {
  const int hd = c.head_dim, gw = group_heads * hd, q_per_kv = c.num_heads / c.num_kv_heads;
  const int64_t q_dim = int64_t{c.num_heads} * hd;
  std::vector<double> m(static_cast<size_t>(gw) * gw, 0.0);
  for (int i = 0; i < group_heads; ++i) {
    const int kvh = group * group_heads + i;
    for (int h = kvh * q_per_kv; h < (kvh + 1) * q_per_kv; ++h) {
      for (int d = 0; d < c.dim; ++d) {
        const float* row = wo + d * q_dim + int64_t{h} * hd;
        for (int a = 0; a < hd; ++a) {
          for (int b = 0; b < hd; ++b) {
            m[static_cast<size_t>(i * hd + a) * gw + i * hd + b] += double{row[a]} * row[b];
          }
        }
      }
    }
  }
  return m;
}

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
  const int q_dim = c.num_heads * c.head_dim;
  forward->set_kv_observer([&](int layer, int64_t, int64_t rows, const float* q, const float* k,
                               const float* v) { moments.Add(layer, rows, q, q_dim, k, v); });
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
      // Weighted PCA: with the metric M, the eigenvectors u of
      // M^1/2 C M^1/2 give the encoder rows u^T M^1/2 and the basis rows
      // M^-1/2 u, which minimize the mean M-norm of the reconstruction
      // error; M = I is plain PCA (orthonormal, encoder = basis).
      std::vector<SymmetricEigenResult> eig;
      std::vector<std::vector<double>> sqrt_m, inv_sqrt_m;
      for (int g = 0; g < groups; ++g) {
        std::vector<double> cov = moments.sum(l, g, part);
        if (options.center) {  // the covariance: S - N mu mu^T
          const std::vector<double> mu = moments.mean(l, g, part);
          const double n = static_cast<double>(moments.count(l));
          for (int i = 0; i < gw; ++i) {
            for (int j = 0; j <= i; ++j) cov[static_cast<size_t>(i) * gw + j] -= n * mu[i] * mu[j];
          }
        }
        for (int i = 0; i < gw; ++i) {  // both triangles, for the products
          for (int j = i + 1; j < gw; ++j)
            cov[static_cast<size_t>(i) * gw + j] = cov[static_cast<size_t>(j) * gw + i];
        }
        if (options.weighted) {
          std::vector<double> m = part == 0
                                      ? KeyMetric(c, moments.q_sum(l), g, group_heads)
                                      : ValueMetric(c, weights.layers[l].wo.data, g, group_heads);
          Ridge(gw, m, kMetricRidge);
          sqrt_m.push_back(MatrixFunction(gw, m, [](double x) { return std::sqrt(x); }));
          inv_sqrt_m.push_back(
              MatrixFunction(gw, m, [](double x) { return x > 0 ? 1 / std::sqrt(x) : 0.0; }));
          cov = MatMul(gw, MatMul(gw, sqrt_m.back(), cov), sqrt_m.back());
        }
        eig.push_back(SymmetricEigen(gw, cov));
      }
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
      std::vector<float>& encoder = part == 0 ? layer.k_encoder : layer.v_encoder;
      basis.assign(static_cast<size_t>(groups) * rank * gw, 0.0f);
      encoder.assign(basis.size(), 0.0f);
      for (int g = 0; g < groups; ++g) {
        kept = std::min(kept, Kept(eig[g].values, rank));
        for (int r = 0; r < rank; ++r) {
          const double* u = eig[g].vectors.data() + static_cast<size_t>(r) * gw;
          for (int e = 0; e < gw; ++e) {
            double enc = u[e], dec = u[e];
            if (options.weighted) {
              enc = dec = 0;
              for (int a = 0; a < gw; ++a) {
                enc += sqrt_m[g][static_cast<size_t>(e) * gw + a] * u[a];
                dec += inv_sqrt_m[g][static_cast<size_t>(e) * gw + a] * u[a];
              }
            }
            const size_t at = (static_cast<size_t>(g) * rank + r) * gw + e;
            encoder[at] = static_cast<float>(enc);
            basis[at] = static_cast<float>(dec);
          }
        }
      }
      (part == 0 ? layer.rank_k : layer.rank_v) = rank;
      std::vector<float>& mean = part == 0 ? layer.k_mean : layer.v_mean;
      mean.assign(static_cast<size_t>(groups) * gw, 0.0f);
      for (int g = 0; g < groups && options.center; ++g) {
        const std::vector<double> mu = moments.mean(l, g, part);
        for (int e = 0; e < gw; ++e)
          mean[static_cast<size_t>(g) * gw + e] = static_cast<float>(mu[e]);
      }
      (part == 0 ? out.k_energy_kept : out.v_energy_kept).push_back(kept);
    }
  }
  KV_RETURN_IF_ERROR(ValidateLowRankKv(kv, "calibration"));
  return out;
}

}  // namespace kvserve
