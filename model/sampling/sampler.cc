#include "model/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>

namespace kvserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Weights are summed in blocks of this many ids so that the draw can skip
// whole blocks; the lanes make the sums vectorisable yet order-defined.
constexpr int32_t kBlock = 256;
constexpr int kLanes = 8;

[[noreturn]] void Die(const char* what, int32_t token, int32_t vocab) {
  std::fprintf(stderr, "Sampler: %s token id %d outside [0, %d)\n", what, token, vocab);
  std::abort();
}

void CheckIds(std::span<const int32_t> ids, int32_t vocab, const char* what) {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab) Die(what, t, vocab);
  }
}

// Non-NaN floats as signed integers in the same order (-0 is made +0 so
// that they tie, as they compare). Integer compares vectorise where float
// ones do not: GCC will not if-convert a float compare that may trap, and we
// do not build with -fno-trapping-math.
inline int32_t OrderKey(float x) {
  const int32_t bits = std::bit_cast<int32_t>(x + 0.0f);
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}
inline float FromOrderKey(int32_t key) {
  return std::bit_cast<float>(key ^ ((key >> 31) & 0x7FFFFFFF));
}
// For w >= 0: w >= bar as an integer compare (both non-negative).
inline bool AtLeast(float w, float bar) {
  return std::bit_cast<uint32_t>(w) >= std::bit_cast<uint32_t>(bar);
}
// Histogram bucket of a weight in [0, 1]: its top 12 bits (exponent and 3
// mantissa bits), monotone in the weight; 1.0f is the largest.
constexpr int32_t kNumBuckets = (0x3F800000 >> 20) + 1;
inline int32_t BucketOf(float w) { return static_cast<int32_t>(std::bit_cast<uint32_t>(w) >> 20); }

// keep ? w : 0 without a branch.
inline float KeepIf(float w, bool keep) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(w) & (0u - static_cast<uint32_t>(keep)));
}

// exp(x) for x <= 0 (x = -inf gives 0), in plain IEEE float operations so
// that it vectorises and gives the same bits on every machine (libm's expf
// is neither). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, and a
// degree-6 polynomial for exp(r) (Cephes' coefficients); relative error
// below 1e-7 over all of [-87, 0]. Below -87 the result is flushed to 0 (it
// would be < 2^-125 of the top token's weight). Selects are done on bits so
// the loop has no branch.
inline float ExpNonPositive(float x) {
  constexpr uint32_t kMinus87 = 0xC2AE0000u;  // bits of -87.0f
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const bool underflow = bits > kMinus87;  // for x <= 0, larger bits = more negative
  const float clamped = std::bit_cast<float>(underflow ? kMinus87 : bits);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = clamped * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  // 2^n by adding n to the exponent field; n in [-126, 0] and y in
  // [0.7, 1.42] keep the result a normal float.
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const uint32_t scaled = std::bit_cast<uint32_t>(y) + static_cast<uint32_t>(n_int) * (1u << 23);
  const uint32_t keep = static_cast<uint32_t>(underflow) - 1u;  // all ones unless underflow
  return std::bit_cast<float>(scaled & keep);
}

// w[i] = exp(logits[i] - max_logit). The hottest loop of a draw: cloned for
// AVX2, which computes the same bits (the same IEEE operations per element;
// the target has no FMA to contract into).
__attribute__((target_clones("avx2", "default"))) void ExpWeights(const float* logits, float* w,
                                                                  size_t n, float max_logit) {
  for (size_t i = 0; i < n; ++i) w[i] = ExpNonPositive(logits[i] - max_logit);
}

// Largest value, NaN ignored (-inf if there is none).
float MaxOf(std::span<const float> v) {
  const int32_t neg_inf = OrderKey(-kInf);
  auto key = [neg_inf](float x) { return x == x ? OrderKey(x) : neg_inf; };
  int32_t lanes[kLanes];
  std::fill(lanes, lanes + kLanes, neg_inf);
  size_t i = 0;
  for (; i + kLanes <= v.size(); i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const int32_t k = key(v[i + j]);
      lanes[j] = k > lanes[j] ? k : lanes[j];
    }
  }
  int32_t m = neg_inf;
  for (; i < v.size(); ++i) m = std::max(m, key(v[i]));
  for (int j = 0; j < kLanes; ++j) m = std::max(m, lanes[j]);
  return FromOrderKey(m);
}

// Lowest id among the largest logits; NaN never wins.
int32_t Argmax(std::span<const float> logits) {
  const float m = MaxOf(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == m) return static_cast<int32_t>(i);
  }
  return 0;  // every logit is NaN
}

// 53 random bits -> [0, 1), exactly representable, the same everywhere.
double ToUnit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Leaves the k (< logits.size()) first ids in ByLogitDesc order in ids[0, k),
// sorted. One pass keeps only ids that beat the current k-th best: the buffer
// is cut back to k with nth_element whenever it fills, which raises the bar,
// so most ids cost one comparison.
void TopK(std::span<const float> logits, int32_t k, std::vector<int32_t>& ids) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  ids.resize(vocab);
  const ByLogitDesc cmp{logits.data()};
  const int32_t capacity = std::min(vocab, std::max(4 * k, 2048));
  int32_t n = 0;
  bool have_bar = false;
  float bar = -kInf;
  for (int32_t i = 0; i < vocab; ++i) {
    // A later id that only ties the k-th best loses the tie, hence '>'.
    if (!have_bar || logits[i] > bar) {
      ids[n++] = i;
      if (n == capacity && n > k) {
        std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.begin() + n, cmp);
        n = k;
        bar = logits[ids[k - 1]];
        have_bar = true;
      }
    }
  }
  if (n > k) std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.begin() + n, cmp);
  std::sort(ids.begin(), ids.begin() + k, cmp);
}

}  // namespace

SamplerState SamplerState::ForRequest(const SamplingParams& params) {
  if (params.seed.has_value()) return SamplerState(*params.seed);
  std::random_device device;
  uint64_t seed = (static_cast<uint64_t>(device()) << 32) ^ device();
  return SamplerState(seed);
}

void Sampler::ApplyPenalties(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> prompt, std::span<const int32_t> output) {
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
  if (!repetition && !additive) return;
  const int32_t vocab = static_cast<int32_t>(logits.size());
  CheckIds(prompt, vocab, "prompt");
  CheckIds(output, vocab, "output");
  // Growing keeps the all-zero invariant.
  if (seen_.size() < logits.size()) seen_.resize(logits.size(), 0);
  if (counts_.size() < logits.size()) counts_.resize(logits.size(), 0);

  if (repetition) {
    const float penalty = params.repetition_penalty;
    auto penalize_once = [&](int32_t t) {
      if (seen_[t]) return;
      seen_[t] = 1;
      float& l = logits[t];
      l = l > 0.0f ? l / penalty : l * penalty;
    };
    for (int32_t t : prompt) penalize_once(t);
    for (int32_t t : output) penalize_once(t);
    for (int32_t t : prompt) seen_[t] = 0;
    for (int32_t t : output) seen_[t] = 0;
  }
  if (additive) {
    for (int32_t t : output) ++counts_[t];
    for (int32_t t : output) {
      if (counts_[t] == 0) continue;  // already applied for this id
      // Two subtractions in vLLM's order, so results match it bit for bit.
      logits[t] -= params.frequency_penalty * static_cast<float>(counts_[t]);
      logits[t] -= params.presence_penalty;
      counts_[t] = 0;
    }
  }
}

int32_t Sampler::Sample(std::span<float> logits, const SamplingParams& params,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        SamplerState* state, SampleLogprobs* logprobs, int32_t num_top_logprobs,
                        std::span<const uint32_t> allowed) {
  if (logits.empty()) {
    std::fprintf(stderr, "Sampler: empty logits row\n");
    std::abort();
  }
  if (logprobs != nullptr) {
    raw_.assign(logits.begin(), logits.end());
    for (float& l : raw_) l = l == l ? l : -kInf;  // keeps the orderings strict
  }
  ApplyPenalties(logits, params, prompt, output);
  if (!allowed.empty()) ApplyMask(logits, allowed);

  int32_t chosen;
  if (params.is_greedy()) {
    chosen = Argmax(logits);
  } else {
    const double unit = ToUnit(state->rng());  // exactly one draw per random sample
    const float temperature = params.temperature;
    if (temperature != 1.0f) {
      for (float& l : logits) l /= temperature;
    }
    for (float& l : logits) l = l == l ? l : -kInf;  // NaN can never be drawn
    const float max_logit = MaxOf(logits);
    const int32_t vocab = static_cast<int32_t>(logits.size());
    if (!std::isfinite(max_logit)) {
      chosen = Argmax(logits);  // degenerate row: no distribution to draw from
    } else {
      ComputeWeights(logits, max_logit);
      if (params.top_k > 0 && params.top_k < vocab) {
        chosen = SampleTopK(logits, params, params.top_k, unit);
      } else {
        if (params.min_p > 0.0f && params.top_p >= 1.0f) {
          // The top token's weight is exp(0) = 1, so min-p's "p >= min_p *
          // p_max" is "weight >= min_p". (After top-p: SampleTopP does it.)
          for (float& w : weights_) w = KeepIf(w, AtLeast(w, params.min_p));
        }
        const double total = SumBlocks();
        chosen = params.top_p < 1.0f ? SampleTopP(logits, params, total, unit)
                                     : DrawFromWeights(unit * total);
      }
    }
  }
  if (logprobs != nullptr) FillLogprobs(raw_, chosen, num_top_logprobs, logprobs);
  return chosen;
}

void Sampler::ApplyMask(std::span<float> logits, std::span<const uint32_t> allowed) {
  const size_t vocab = logits.size();
  if (allowed.size() != (vocab + 31) / 32) {
    std::fprintf(stderr, "Sampler: a mask of %zu words for vocab %zu\n", allowed.size(), vocab);
    std::abort();
  }
  bool any = false;
  for (size_t w = 0; w < allowed.size(); ++w) {
    const uint32_t bits = allowed[w];
    any |= bits != 0;
    if (bits == ~uint32_t{0}) continue;
    const size_t end = std::min(vocab, w * 32 + 32);
    if (bits == 0) {
      std::fill(logits.begin() + w * 32, logits.begin() + end, -kInf);
      continue;
    }
    for (size_t i = w * 32; i < end; ++i) {
      if (!((bits >> (i & 31)) & 1)) logits[i] = -kInf;
    }
  }
  if (!any) {
    std::fprintf(stderr, "Sampler: a mask that allows no token\n");
    std::abort();
  }
}

void Sampler::ComputeWeights(std::span<const float> logits, float max_logit) {
  weights_.resize(logits.size());
  ExpWeights(logits.data(), weights_.data(), logits.size(), max_logit);
}

double Sampler::SumBlocks() {
  const size_t vocab = weights_.size();
  const size_t num_blocks = (vocab + kBlock - 1) / kBlock;
  block_sums_.resize(num_blocks);
  double total = 0.0;
  for (size_t b = 0; b < num_blocks; ++b) {
    const float* w = weights_.data() + b * kBlock;
    const size_t n = std::min<size_t>(kBlock, vocab - b * kBlock);
    double lanes[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) lanes[j] += w[i + j];
    }
    double sum = 0.0;
    for (int j = 0; j < kLanes; ++j) sum += lanes[j];
    for (; i < n; ++i) sum += w[i];
    block_sums_[b] = sum;
    total += sum;
  }
  return total;
}

int32_t Sampler::DrawFromWeights(double target) const {
  const size_t vocab = weights_.size();
  // Skip whole blocks, then walk ids. The block sums round differently from
  // the walk, so fall back to the block's last positive weight; the result
  // is still a fixed function of the weights and target.
  size_t b = 0;
  double cumulative = 0.0;
  while (b + 1 < block_sums_.size() && cumulative + block_sums_[b] <= target) {
    cumulative += block_sums_[b++];
  }
  int32_t last = -1;
  for (size_t i = b * kBlock; i < std::min(vocab, (b + 1) * kBlock); ++i) {
    if (weights_[i] == 0.0f) continue;
    cumulative += weights_[i];
    last = static_cast<int32_t>(i);
    if (cumulative > target) return last;
  }
  if (last >= 0) return last;
  for (size_t i = vocab; i-- > 0;) {  // only reachable through rounding
    if (weights_[i] > 0.0f) return static_cast<int32_t>(i);
  }
  return 0;
}

int32_t Sampler::SampleTopK(std::span<const float> logits, const SamplingParams& params, int32_t k,
                            double unit) {
  TopK(logits, k, ids_);  // ids_[0, k), most probable first
  int32_t kept = k;
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    for (int32_t j = 0; j < k; ++j) mass += weights_[ids_[j]];
    const double needed = params.top_p * mass;
    double cumulative = 0.0;
    kept = 0;
    while (kept < k) {
      cumulative += weights_[ids_[kept++]];
      if (cumulative >= needed) break;
    }
  }
  // Min-p: weights fall along the prefix and the first is 1, so it is a cut.
  if (params.min_p > 0.0f) {
    int32_t j = 1;
    while (j < kept && AtLeast(weights_[ids_[j]], params.min_p)) ++j;
    kept = j;
  }
  double total = 0.0;
  for (int32_t j = 0; j < kept; ++j) total += weights_[ids_[j]];
  const double target = unit * total;
  double cumulative = 0.0;
  int32_t last = ids_[0];
  for (int32_t j = 0; j < kept; ++j) {
    const float w = weights_[ids_[j]];
    if (w == 0.0f) continue;
    cumulative += w;
    last = ids_[j];
    if (cumulative > target) return last;
  }
  return last;  // only reachable through rounding
}

int32_t Sampler::SampleTopP(std::span<const float> logits, const SamplingParams& params,
                            double total, double unit) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const int32_t boundary = TopPBoundary(logits, params.top_p * total);
  // Zero what is cut (after the boundary, or below min-p), then draw in id
  // order over what is left.
  const float min_p = params.min_p;
  if (boundary >= 0) {
    const int32_t bar = OrderKey(logits[boundary]);
    for (int32_t i = 0; i < vocab; ++i) {
      const int32_t key = OrderKey(logits[i]);
      const bool in = key > bar || (key == bar && i <= boundary);
      weights_[i] = KeepIf(weights_[i], in && AtLeast(weights_[i], min_p));
    }
  } else if (min_p > 0.0f) {
    for (float& w : weights_) w = KeepIf(w, AtLeast(w, min_p));
  }
  return DrawFromWeights(unit * SumBlocks());
}

int32_t Sampler::TopPBoundary(std::span<const float> logits, double needed) {
  // 1. Mass per weight bucket (the weight's exponent and 3 mantissa bits:
  //    monotone in the weight, so in the logit). Four interleaved copies of
  //    the histogram keep consecutive ids off each other's adds.
  const int32_t vocab = static_cast<int32_t>(logits.size());
  constexpr int kCopies = 4;
  bucket_mass_.assign(kCopies * kNumBuckets, 0.0);
  for (int32_t i = 0; i < vocab; ++i) {
    bucket_mass_[(i % kCopies) * kNumBuckets + BucketOf(weights_[i])] += weights_[i];
  }
  // 2. Walk the buckets down to the one where the mass is reached.
  double need = needed;
  int32_t bucket = -1;
  for (int32_t key = kNumBuckets - 1; key >= 0; --key) {
    double mass = 0.0;
    for (int c = 0; c < kCopies; ++c) mass += bucket_mass_[c * kNumBuckets + key];
    if (mass >= need) {
      bucket = key;
      break;
    }
    need -= mass;
  }
  if (bucket < 0) return -1;  // rounding kept everything

  // 3. Weighted quickselect inside that bucket for the last id of the
  //    prefix. Each round partitions the candidates around a pivot
  //    (branch-free Lomuto, our own so the mass sums are the same on every
  //    build) and keeps the side holding the boundary.
  ids_.resize(vocab);
  int32_t n = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (BucketOf(weights_[i]) == bucket) ids_[n++] = i;
  }
  const ByLogitDesc cmp{logits.data()};
  int32_t lo = 0, hi = n;
  for (int round = 0; lo < hi; ++round) {
    if (hi - lo <= 32 || round > 64) {
      std::sort(ids_.begin() + lo, ids_.begin() + hi, cmp);
      for (int32_t j = lo; j < hi; ++j) {
        need -= weights_[ids_[j]];
        if (need <= 0.0) return ids_[j];
      }
      break;
    }
    // Median of three as pivot, moved to the end of the range.
    int32_t a = lo, b = lo + (hi - lo) / 2, c = hi - 1;
    if (cmp(ids_[b], ids_[a])) std::swap(a, b);
    if (cmp(ids_[c], ids_[b])) std::swap(b, c);
    if (cmp(ids_[b], ids_[a])) std::swap(a, b);
    std::swap(ids_[b], ids_[hi - 1]);
    const int32_t pivot = ids_[hi - 1];
    int32_t store = lo;
    double before_mass = 0.0;
    for (int32_t j = lo; j < hi - 1; ++j) {
      const int32_t id = ids_[j];
      const bool before = cmp(id, pivot);
      ids_[j] = ids_[store];
      ids_[store] = id;
      store += before;
      before_mass += KeepIf(weights_[id], before);
    }
    std::swap(ids_[store], ids_[hi - 1]);
    if (before_mass >= need) {
      hi = store;
    } else {
      need -= before_mass;
      need -= weights_[pivot];
      if (need <= 0.0) return pivot;
      lo = store + 1;
    }
  }
  // Rounding left the mass short inside the bucket: keep all of it.
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (BucketOf(weights_[i]) == bucket && (last < 0 || cmp(last, i))) last = i;
  }
  return last;
}

void Sampler::FillLogprobs(std::span<const float> raw, int32_t chosen, int32_t num_top,
                           SampleLogprobs* out) {
  const int32_t vocab = static_cast<int32_t>(raw.size());
  const float max_logit = MaxOf(raw);
  weights_.resize(vocab);
  ExpWeights(raw.data(), weights_.data(), raw.size(), max_logit);
  const double log_z = max_logit + std::log(SumBlocks());
  auto logprob = [&](int32_t id) { return static_cast<float>(raw[id] - log_z); };

  out->chosen = {chosen, logprob(chosen)};
  out->top.clear();
  const int32_t n = std::clamp(num_top, 0, vocab);
  if (n == 0) return;
  if (n < vocab) {
    TopK(raw, n, ids_);
  } else {
    ids_.resize(vocab);
    std::iota(ids_.begin(), ids_.end(), 0);
    std::sort(ids_.begin(), ids_.end(), ByLogitDesc{raw.data()});
  }
  out->top.reserve(n);
  for (int32_t j = 0; j < n; ++j) out->top.push_back({ids_[j], logprob(ids_[j])});
}

}  // namespace kvserve
