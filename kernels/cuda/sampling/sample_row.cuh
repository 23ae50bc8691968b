// The device sampler's algorithm for one logits row, written against a Team
// (the threads that sample the row together) so the very same code runs on
// the GPU (one thread block per row, kernels/cuda/sampling/sample_kernel.cuh) and on
// the host with a one-thread team (SerialRowTeam below), which is how tests
// in make test check it against model/sampling/sampler.h without a device.
//
// Semantics (model/sampling/sampler.h's, operation for operation where it matters):
//   raw logprobs:  log_softmax of the logits as passed in (NaN as -inf),
//                  before penalties; top-n by (logit desc, id asc).
//   penalties:     repetition once per distinct id of prompt + output
//                  (l > 0 ? l / r : l * r), then frequency and presence over
//                  output counts (l -= f * count; l -= p), same rounding.
//   greedy:        temperature 0: lowest id of the largest processed logit,
//                  NaN never wins, all-NaN gives 0. Exactly the CPU's token.
//   otherwise:     l /= temperature (unless 1), NaN -> -inf; a row whose max
//                  is not finite falls back to the argmax; weights
//                  w = ExpNonPositive(l - max) (the CPU's polynomial, bit for
//                  bit); top-k keeps the k first by (l desc, id asc); top-p
//                  keeps the shortest such prefix of that set whose weight
//                  reaches top_p of the set's; min-p keeps w >= min_p; one
//                  draw over the survivors.
// Where it differs from the CPU, by design:
//   - masses are fixed point: ToFixed(w) = floor(w * 2^43) summed as uint64,
//     exact and order-independent, so a row's result never depends on the
//     thread count or on the other rows. Against the CPU's double sums the
//     top-p boundary can only differ where the CPU's cumulative mass lies
//     within vocab * 2^-43 (1.2e-7 at vocab 128k; the top weight is 1) of
//     top_p times the total; a token with w < 2^-43 cannot be drawn (its
//     probability is below 2^-43 / total anyway).
//   - the draw: 64 bits from Philox4x32-10 at (seed, step) (philox.cuh),
//     target = floor(bits * mass / 2^64), the survivor whose cumulative
//     fixed-point mass in id order first exceeds it. Not the CPU's
//     mt19937_64 stream: seeded requests are reproducible on the GPU, and
//     whatever they are batched with, but differ from the CPU's draws.
//   - logprobs sum exp in double in the team's order: equal to the CPU's to
//     about 1e-12 relative (the tests use 1e-5).
//
// Search without sorting: the k-th key (top-k, top-n) and the top-p
// boundary come from a 4-pass radix select over 8-bit digits of a 32-bit
// order key (counts or fixed-point masses per bin), and ties at the
// boundary are cut in id order by FindCumulative (the team's ordered
// prefix search). Cost per row: about 24 passes over the row in the worst
// case (top-k + top-p + min-p + top-n logprobs), 2 for greedy without
// logprobs (copy + argmax); see sample.h.
//
// Team contract (beyond kv_encode.cuh's): For(n, f) covers [0, n) across
// the team in any order; MaxF32 / SumU64 / SumF64 fold per-thread partials
// in a fixed order and return the total on every thread; ArgMax folds
// (value, id) pairs; FindCumulative(n, f, target) returns, on every thread,
// the first id in id order whose inclusive prefix sum of f exceeds target
// (-1 if none); HistAdd / AtomicAdd / AtomicOr / AtomicExch are atomic
// across the team; Sync() is a barrier that also orders memory.
//
// Thread-safety: device/host functions over caller-owned memory.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/cuda/device/philox.cuh"
#include "kernels/sample_rows.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace kvserve::cuda::sample_row {

inline constexpr int kBins = 256;
inline constexpr int kFixedShift = 43;  // weights in [0, 1] -> [0, 2^43]

// Shared state of one row's team (shared memory on the device).
struct RowShared {
  uint64_t bins[kBins];
  int32_t top_ids[kMaxTopLogprobs];
  int32_t top_count;
};

// ---- numerics ------------------------------------------------------------------

KV_HOST_DEVICE inline float NegInf() { return exact::FloatOf(0xff800000u); }

// model/sampling/sampler.cc's ExpNonPositive, transcribed (no FMA anywhere): e^x
// for x <= 0, flushed to 0 below -87.
KV_HOST_DEVICE inline float ExpNonPositive(float x) {
  using namespace exact;
  constexpr uint32_t kMinus87 = 0xC2AE0000u;
  const uint32_t bits = BitsOf(x);
  const bool underflow = bits > kMinus87;
  const float clamped = FloatOf(underflow ? kMinus87 : bits);
  constexpr float kRound = 12582912.0f;
  const float shifted = Add(Mul(clamped, 1.44269504088896341f), kRound);
  const float n = Sub(shifted, kRound);
  float r = Sub(clamped, Mul(n, 0.693359375f));
  r = Sub(r, Mul(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = Add(Mul(p, r), 1.3981999507e-3f);
  p = Add(Mul(p, r), 8.3334519073e-3f);
  p = Add(Mul(p, r), 4.1665795894e-2f);
  p = Add(Mul(p, r), 1.6666665459e-1f);
  p = Add(Mul(p, r), 5.0000001201e-1f);
  const float y = Add(Add(Mul(p, Mul(r, r)), r), 1.0f);
  const int32_t n_int =
      static_cast<int32_t>(BitsOf(shifted)) - static_cast<int32_t>(BitsOf(kRound));
  const uint32_t scaled = BitsOf(y) + static_cast<uint32_t>(n_int) * (1u << 23);
  const uint32_t keep = static_cast<uint32_t>(underflow) - 1u;
  return FloatOf(scaled & keep);
}

// floor(w * 2^43) for w in [0, 1] (the product is exact).
KV_HOST_DEVICE inline uint64_t ToFixed(float w) {
  const float scaled = exact::Mul(w, 8796093022208.0f);  // 2^43
#if defined(__CUDA_ARCH__)
  return __float2ull_rz(scaled);
#else
  return static_cast<uint64_t>(scaled);
#endif
}

KV_HOST_DEVICE inline uint64_t MulHi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

KV_HOST_DEVICE inline double Log(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}

// An order key: a > b (floats, -0 == +0) iff DescKey(a) < DescKey(b). Not
// for NaN.
KV_HOST_DEVICE inline uint32_t DescKey(float x) {
  const uint32_t bits = exact::BitsOf(exact::Add(x, 0.0f));  // -0 -> +0
  const uint32_t ascending = bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
  return ~ascending;
}

KV_HOST_DEVICE inline float FromDescKey(uint32_t key) {
  const uint32_t ascending = ~key;
  return exact::FloatOf(ascending ^ ((ascending >> 31) ? 0x80000000u : 0xffffffffu));
}

// Logit i of a row stored as `dtype`, widened exactly.
KV_HOST_DEVICE inline float LoadLogit(const void* row, ActDtype dtype, int64_t i) {
  switch (dtype) {
    case ActDtype::kFp16:
      return kv_encode::Fp16ToFloat(static_cast<const uint16_t*>(row)[i]);
    case ActDtype::kBf16:
      return exact::FloatOf(static_cast<uint32_t>(static_cast<const uint16_t*>(row)[i]) << 16);
    default:
      return static_cast<const float*>(row)[i];
  }
}

// ---- the serial team (host) ------------------------------------------------------

struct SerialRowTeam {
  int rank() const { return 0; }
  int size() const { return 1; }
  void Sync() const {}
  template <typename F>
  void For(int64_t n, F&& f) const {
    for (int64_t i = 0; i < n; ++i) f(static_cast<int32_t>(i));
  }
  float MaxF32(float v) const { return v; }
  uint64_t SumU64(uint64_t v) const { return v; }
  double SumF64(double v) const { return v; }
  int32_t ArgMax(float /*value*/, int32_t id) const { return id; }
  template <typename F>
  int32_t FindCumulative(int32_t n, F&& f, uint64_t target) const {
    uint64_t cumulative = 0;
    for (int32_t i = 0; i < n; ++i) {
      cumulative += f(i);
      if (cumulative > target) return i;
    }
    return -1;
  }
  void HistAdd(uint64_t* bin, uint64_t w) const { *bin += w; }
  int32_t AtomicAdd(int32_t* p, int32_t v) const {
    const int32_t old = *p;
    *p = old + v;
    return old;
  }
  int32_t AtomicOr(int32_t* p, int32_t v) const {
    const int32_t old = *p;
    *p = old | v;
    return old;
  }
  int32_t AtomicExch(int32_t* p, int32_t v) const {
    const int32_t old = *p;
    *p = v;
    return old;
  }
};

// ---- building blocks ---------------------------------------------------------------

// (value, id) is better than the current best (best_id < 0: none yet):
// larger value, or equal value (-0 == +0) and lower id; NaN never is.
KV_HOST_DEVICE inline bool Better(float value, int32_t id, float best_value, int32_t best_id) {
  if (id < 0 || value != value) return false;  // an empty slot or NaN never wins
  if (best_id < 0) return true;
  return value > best_value || (value == best_value && id < best_id);
}

// Lowest id among the largest non-NaN x[i]; -1 when every x[i] is NaN.
template <typename Team>
KV_HOST_DEVICE int32_t ArgMaxOf(const Team& team, const float* x, int32_t n) {
  float best_value = 0.0f;
  int32_t best_id = -1;
  team.For(n, [&](int32_t i) {
    if (Better(x[i], i, best_value, best_id)) {
      best_value = x[i];
      best_id = i;
    }
  });
  return team.ArgMax(best_value, best_id);
}

// The first bin where the running total reaches `need` (>= 1): on return
// *before is the total of the bins below it. Bin kBins - 1 if none does.
KV_HOST_DEVICE inline int WalkBins(const uint64_t* bins, uint64_t need, uint64_t* before) {
  uint64_t total = 0;
  for (int b = 0; b < kBins; ++b) {
    if (total + bins[b] >= need) {
      *before = total;
      return b;
    }
    total += bins[b];
  }
  *before = total;
  return kBins - 1;
}

struct Selected {
  uint32_t key;   // the order key where the cumulative weight reaches need
  uint64_t need;  // weight still needed inside that key (>= 1)
};

// Radix select over the 32-bit order keys of the elements with
// key_of(i, &key) true: the key K with W(key < K) < need <= W(key <= K),
// where W sums weight_of(i) (weights are counts or fixed-point masses).
// Four passes over 8-bit digits, most significant first.
template <typename Team, typename KeyOf, typename WeightOf>
KV_HOST_DEVICE Selected RadixSelect(const Team& team, RowShared* sh, int32_t n, KeyOf&& key_of,
                                    WeightOf&& weight_of, uint64_t need) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    team.For(kBins, [&](int32_t b) { sh->bins[b] = 0; });
    team.Sync();
    team.For(n, [&](int32_t i) {
      uint32_t key;
      if (!key_of(i, &key) || (key & mask) != prefix) return;
      const uint64_t w = weight_of(i);
      if (w != 0) team.HistAdd(&sh->bins[(key >> shift) & 0xff], w);
    });
    team.Sync();
    uint64_t before = 0;
    const int b = WalkBins(sh->bins, need, &before);
    need -= before;
    prefix |= static_cast<uint32_t>(b) << shift;
    mask |= 0xffu << shift;
    team.Sync();  // bins are cleared by the next pass
  }
  return Selected{prefix, need};
}

// A prefix of the elements in (key asc, id asc) order, as a cut: the
// elements with key < key_cut, and those with key == key_cut and id <= id_cut.
struct Cut {
  bool on = false;
  uint32_t key_cut = 0;
  int32_t id_cut = 0;
  KV_HOST_DEVICE bool Keeps(uint32_t key, int32_t id) const {
    return !on || key < key_cut || (key == key_cut && id <= id_cut);
  }
};

// The cut keeping the first `count` elements (count in [1, number of
// elements]) in (key asc, id asc) order among those with in(i, &key) true.
template <typename Team, typename KeyOf>
KV_HOST_DEVICE Cut CutFirst(const Team& team, RowShared* sh, int32_t n, KeyOf&& key_of,
                            uint64_t count) {
  const Selected s = RadixSelect(
      team, sh, n, key_of, [](int32_t) { return uint64_t{1}; }, count);
  const int32_t id = team.FindCumulative(
      n,
      [&](int32_t i) {
        uint32_t key;
        return static_cast<uint64_t>(key_of(i, &key) && key == s.key);
      },
      s.need - 1);
  return Cut{true, s.key, id < 0 ? n - 1 : id};
}

// ---- the row ---------------------------------------------------------------------------

struct RowIo {
  const void* logits = nullptr;  // [vocab] of this row, `dtype`
  ActDtype dtype = ActDtype::kFp32;
  int32_t vocab = 0;
  float* processed = nullptr;        // [vocab] workspace; on return the processed logits
  int32_t* counts = nullptr;         // [vocab] all zero on entry, and again on return
  const int32_t* history = nullptr;  // the row's prompt ids, then its output ids
  SampleRowParams params;
};

// Samples one row. Every thread of the team calls it; thread 0 writes *out.
template <typename Team>
KV_HOST_DEVICE void SampleRow(const Team& team, const RowIo& io, RowShared* sh,
                              SampleRowResult* out) {
  using namespace exact;
  const SampleRowParams& p = io.params;
  const int32_t n = io.vocab;
  float* x = io.processed;

  // 1. The row in fp32.
  team.For(n, [&](int32_t i) { x[i] = LoadLogit(io.logits, io.dtype, i); });
  team.Sync();

  // 2. Raw logprobs, before anything changes x: log_z = max + log(sum e^(l -
  //    max)) with NaN as -inf, and the top-n ids.
  const bool want_logprobs = p.num_top_logprobs >= 0;
  double log_z = 0.0;
  int32_t top_n = 0;
  auto raw = [&](int32_t i) {
    const float v = x[i];
    return v != v ? NegInf() : v;
  };
  if (want_logprobs) {
    float local_max = NegInf();
    team.For(n, [&](int32_t i) {
      const float v = raw(i);
      local_max = v > local_max ? v : local_max;
    });
    const float raw_max = team.MaxF32(local_max);
    double local_sum = 0.0;
    team.For(n, [&](int32_t i) {
      local_sum += static_cast<double>(ExpNonPositive(Sub(raw(i), raw_max)));
    });
    log_z = static_cast<double>(raw_max) + Log(team.SumF64(local_sum));
    top_n = p.num_top_logprobs < n ? p.num_top_logprobs : n;
    top_n = top_n < kMaxTopLogprobs ? top_n : kMaxTopLogprobs;
    if (top_n > 0) {
      auto raw_key = [&](int32_t i, uint32_t* key) {
        *key = DescKey(raw(i));
        return true;
      };
      const Cut cut = CutFirst(team, sh, n, raw_key, static_cast<uint64_t>(top_n));
      if (team.rank() == 0) sh->top_count = 0;
      team.Sync();
      team.For(n, [&](int32_t i) {
        if (!cut.Keeps(DescKey(raw(i)), i)) return;
        const int32_t slot = team.AtomicAdd(&sh->top_count, 1);
        if (slot < kMaxTopLogprobs) sh->top_ids[slot] = i;  // exactly top_n get here
      });
      team.Sync();
      if (team.rank() == 0) {  // insertion sort of top_n ids by (raw desc, id asc)
        for (int32_t a = 1; a < top_n; ++a) {
          const int32_t id = sh->top_ids[a];
          int32_t b = a;
          for (; b > 0; --b) {
            const int32_t prev = sh->top_ids[b - 1];
            const uint32_t kp = DescKey(raw(prev)), ki = DescKey(raw(id));
            if (kp < ki || (kp == ki && prev < id)) break;
            sh->top_ids[b] = prev;
          }
          sh->top_ids[b] = id;
        }
      }
    }
  }
  // Thread 0 records the top-n logprobs now, while x still holds the raw
  // logits (the penalties below change it).
  if (team.rank() == 0) {
    for (int32_t j = 0; j < kMaxTopLogprobs; ++j) {
      if (j < top_n) {
        const int32_t id = sh->top_ids[j];
        out->top_ids[j] = id;
        out->top_logprobs[j] = static_cast<float>(static_cast<double>(raw(id)) - log_z);
      } else {
        out->top_ids[j] = -1;
        out->top_logprobs[j] = NegInf();
      }
    }
  }
  team.Sync();

  // 3. Penalties, once per distinct id: counts[t] = output count, plus
  //    kInPrompt when t is in the prompt; the occurrence that swaps it back
  //    to 0 applies the penalty (and leaves counts all zero again).
  const bool repetition = p.repetition_penalty != 1.0f;
  const bool additive = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (repetition || additive) {
    constexpr int32_t kInPrompt = 1 << 30;
    const int32_t* prompt = io.history;
    const int32_t* output = io.history + p.prompt_len;
    int32_t* counts = io.counts;
    team.For(p.output_len, [&](int32_t j) {
      const int32_t t = output[j];
      if (t >= 0 && t < n) team.AtomicAdd(&counts[t], 1);
    });
    team.For(p.prompt_len, [&](int32_t j) {
      const int32_t t = prompt[j];
      if (t >= 0 && t < n) team.AtomicOr(&counts[t], kInPrompt);
    });
    team.Sync();
    auto claim = [&](int32_t t) {
      if (t < 0 || t >= n) return;
      const int32_t c = team.AtomicExch(&counts[t], 0);
      if (c == 0) return;  // another occurrence of t applied it
      const int32_t count = c & (kInPrompt - 1);
      float l = x[t];
      if (repetition) {
        l = l > 0.0f ? Div(l, p.repetition_penalty) : Mul(l, p.repetition_penalty);
      }
      if (additive && count > 0) {
        l = Sub(l, Mul(p.frequency_penalty, static_cast<float>(count)));
        l = Sub(l, p.presence_penalty);
      }
      x[t] = l;
    };
    team.For(p.prompt_len, [&](int32_t j) { claim(prompt[j]); });
    team.For(p.output_len, [&](int32_t j) { claim(output[j]); });
    team.Sync();
  }

  int32_t chosen = -1;
  if (p.temperature == 0.0f) {
    // 4. Greedy.
    chosen = ArgMaxOf(team, x, n);
  } else {
    // 5. Temperature (NaN can never be drawn), then the distribution.
    const float temperature = p.temperature;
    float local_max = NegInf();
    team.For(n, [&](int32_t i) {
      float l = x[i];
      if (temperature != 1.0f) l = Div(l, temperature);
      if (l != l) l = NegInf();
      x[i] = l;
      local_max = l > local_max ? l : local_max;
    });
    const float max_logit = team.MaxF32(local_max);
    team.Sync();
    if (!IsFinite(max_logit)) {
      chosen = ArgMaxOf(team, x, n);  // degenerate row: no distribution
    } else {
      auto weight = [&](int32_t i) { return ExpNonPositive(Sub(x[i], max_logit)); };
      Cut top_k;
      if (p.top_k > 0 && p.top_k < n) {
        top_k = CutFirst(
            team, sh, n,
            [&](int32_t i, uint32_t* key) {
              *key = DescKey(x[i]);
              return true;
            },
            static_cast<uint64_t>(p.top_k));
      }
      auto in_top_k = [&](int32_t i, uint32_t* key) {
        *key = DescKey(x[i]);
        return top_k.Keeps(*key, i);
      };
      Cut top_p;
      if (p.top_p < 1.0f) {
        uint64_t local_mass = 0;
        team.For(n, [&](int32_t i) {
          uint32_t key;
          if (in_top_k(i, &key)) local_mass += ToFixed(weight(i));
        });
        const uint64_t mass = team.SumU64(local_mass);
        // Smallest prefix with cumulative >= top_p * mass (integers: ceil).
        const double want = static_cast<double>(p.top_p) * static_cast<double>(mass);
        uint64_t needed = static_cast<uint64_t>(want);
        if (static_cast<double>(needed) < want) ++needed;
        if (needed < 1) needed = 1;
        if (needed > mass) needed = mass;
        const Selected s = RadixSelect(
            team, sh, n, in_top_k, [&](int32_t i) { return ToFixed(weight(i)); }, needed);
        // Every tie at s.key has the same weight: take just enough of them.
        const uint64_t tie_weight = ToFixed(ExpNonPositive(Sub(FromDescKey(s.key), max_logit)));
        const uint64_t ties =
            tie_weight == 0 ? ~uint64_t{0} : (s.need + tie_weight - 1) / tie_weight;
        const int32_t id = team.FindCumulative(
            n,
            [&](int32_t i) {
              uint32_t key;
              return static_cast<uint64_t>(in_top_k(i, &key) && key == s.key);
            },
            ties - 1);
        top_p = Cut{true, s.key, id < 0 ? n - 1 : id};
      }
      const bool min_p = p.min_p > 0.0f;
      auto survivor_mass = [&](int32_t i) -> uint64_t {
        uint32_t key;
        if (!in_top_k(i, &key) || !top_p.Keeps(key, i)) return 0;
        const float w = weight(i);
        if (min_p && !(w >= p.min_p)) return 0;
        return ToFixed(w);
      };
      uint64_t local_mass = 0;
      team.For(n, [&](int32_t i) { local_mass += survivor_mass(i); });
      const uint64_t mass = team.SumU64(local_mass);
      const uint64_t target = MulHi64(philox::DrawBits(p.seed, p.step), mass);
      chosen = team.FindCumulative(n, survivor_mass, target);
      if (chosen < 0) chosen = ArgMaxOf(team, x, n);  // unreachable: the top token survives
    }
  }
  if (chosen < 0) chosen = 0;  // every logit NaN

  if (team.rank() == 0) {
    out->token = chosen;
    float raw_chosen = LoadLogit(io.logits, io.dtype, chosen);
    if (raw_chosen != raw_chosen) raw_chosen = NegInf();
    out->logprob = want_logprobs ? static_cast<float>(static_cast<double>(raw_chosen) - log_z)
                                 : FloatOf(0x7fc00000u);
  }
}

}  // namespace kvserve::cuda::sample_row
