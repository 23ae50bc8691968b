// The device sampler's algorithm (kernels/cuda/sampling/sample_row.cuh), run on the
// host with a one-thread team, against the CPU sampler (model/sampling/sampler.h):
// greedy tokens and processed logits exactly, draws inside the CPU's
// survivor sets and distributed as they should be, logprobs to 1e-5, and
// the Philox generator against Random123's known answers. The [gpu] test
// then checks the device runs this same code to the same bits.
#include "kernels/cuda/sampling/sample_row.cuh"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/plan/sampling_batch.h"
#include "tests/kernels/sampling_reference.h"

namespace kvserve::cuda::sample_row {
namespace {

using ::kvserve::testing::CpuSample;
using ::kvserve::testing::HostSample;
using ::kvserve::testing::LogitsShape;
using ::kvserve::testing::RandomHistory;
using ::kvserve::testing::RandomLogits;
using ::kvserve::testing::RunCpuSampler;
using ::kvserve::testing::RunHostSampler;
using ::kvserve::testing::SameFloats;
using ::kvserve::testing::Survivors;
using ::kvserve::testing::SurvivorSets;

HostSample HostFp32(const std::vector<float>& logits, const SampleRowParams& p,
                    const std::vector<int32_t>& prompt = {},
                    const std::vector<int32_t>& output = {}) {
  return RunHostSampler(logits.data(), ActDtype::kFp32, static_cast<int32_t>(logits.size()), p,
                        prompt, output);
}

// bf16 codes of `x` (rounded) and the floats they stand for.
void ToBf16(const std::vector<float>& x, std::vector<uint16_t>* codes,
            std::vector<float>* widened) {
  codes->resize(x.size());
  widened->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    (*codes)[i] = kv_encode::FloatToBf16(x[i]);
    (*widened)[i] = LoadLogit(codes->data(), ActDtype::kBf16, static_cast<int64_t>(i));
  }
}

SampleRowParams Penalized(SampleRowParams p) {
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = -0.25f;
  return p;
}

TEST_CASE("Philox4x32-10 reproduces Random123's known-answer vectors", "[kernels][sampling]") {
  using philox::Philox4x32_10;
  using philox::Uint4;
  auto same = [](Uint4 a, Uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; };
  REQUIRE(same(Philox4x32_10({0, 0, 0, 0}, 0, 0),
               {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  REQUIRE(same(Philox4x32_10({~0u, ~0u, ~0u, ~0u}, ~0u, ~0u),
               {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  REQUIRE(same(
      Philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u),
      {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
  // DrawBits puts the step in the counter's upper half and x in the high word.
  const Uint4 r = Philox4x32_10({0, 0, 5, 0}, 7, 0);
  REQUIRE(philox::DrawBits(7, 5) == ((uint64_t{r.x} << 32) | r.y));
}

TEST_CASE("order keys, fixed-point weights and the exp polynomial", "[kernels][sampling]") {
  const float values[] = {-INFINITY, -3e38f, -2.0f, -1.0f, -1e-30f, -0.0f,
                          0.0f,      1e-30f, 1.0f,  2.5f,  3e38f,   INFINITY};
  for (size_t a = 0; a < std::size(values); ++a) {
    for (size_t b = 0; b < std::size(values); ++b) {
      INFO(values[a] << " vs " << values[b]);
      REQUIRE((values[a] > values[b]) == (DescKey(values[a]) < DescKey(values[b])));
      REQUIRE((values[a] == values[b]) == (DescKey(values[a]) == DescKey(values[b])));
    }
    REQUIRE(DescKey(FromDescKey(DescKey(values[a]))) == DescKey(values[a]));
  }
  REQUIRE(ToFixed(1.0f) == (uint64_t{1} << 43));
  REQUIRE(ToFixed(0.0f) == 0);
  REQUIRE(ToFixed(0.75f) == (uint64_t{3} << 41));
  REQUIRE(ExpNonPositive(0.0f) == 1.0f);
  REQUIRE(ExpNonPositive(-INFINITY) == 0.0f);
  REQUIRE(ExpNonPositive(-100.0f) == 0.0f);
  for (float x = -86.0f; x <= 0.0f; x += 0.37f) {
    REQUIRE(std::abs(ExpNonPositive(x) / std::exp(static_cast<double>(x)) - 1.0) < 2e-7);
  }
}

TEST_CASE("greedy picks the CPU sampler's token and leaves its processed logits",
          "[kernels][sampling]") {
  std::mt19937_64 rng(11);
  int rows = 0;
  for (int32_t vocab : {1, 2, 7, 512, 3001, 32000}) {
    for (const LogitsShape& shape :
         {LogitsShape{}, LogitsShape{3.0f, 4}, LogitsShape{0.5f, 2, 3, 2, true},
          LogitsShape{1e-3f, 0, 0, 0, true}}) {
      for (bool penalties : {false, true}) {
        for (bool bf16 : {false, true}) {
          std::vector<float> logits = RandomLogits(vocab, shape, &rng);
          std::vector<int32_t> prompt, output;
          RandomHistory(vocab, 17, 9, &rng, &prompt, &output);
          SampleRowParams p;
          p.temperature = 0.0f;
          if (penalties) p = Penalized(p);
          std::vector<uint16_t> codes;
          std::vector<float> widened = logits;
          HostSample h;
          if (bf16) {
            ToBf16(logits, &codes, &widened);
            h = RunHostSampler(codes.data(), ActDtype::kBf16, vocab, p, prompt, output);
          } else {
            h = HostFp32(logits, p, prompt, output);
          }
          const CpuSample cpu = RunCpuSampler(widened, p, prompt, output);
          INFO("vocab " << vocab << " ties " << shape.ties << " nans " << shape.nans
                        << " penalties " << penalties << " bf16 " << bf16);
          REQUIRE(h.result.token == cpu.token);
          int64_t bad = -1;
          INFO("first differing processed logit " << bad);
          REQUIRE(SameFloats(h.processed, cpu.processed, &bad));
          REQUIRE(h.counts_zero_after);
          REQUIRE(std::isnan(h.result.logprob));  // not asked for
          ++rows;
        }
      }
    }
  }
  SECTION("ties go to the lowest id, -0 ties +0, NaN never wins, all NaN gives 0") {
    SampleRowParams p;
    p.temperature = 0.0f;
    REQUIRE(HostFp32({1.0f, 3.0f, NAN, 3.0f}, p).result.token == 1);
    REQUIRE(HostFp32({NAN, -0.0f, 0.0f, -1.0f}, p).result.token == 1);
    REQUIRE(HostFp32({NAN, NAN, NAN}, p).result.token == 0);
    REQUIRE(HostFp32({-INFINITY, NAN, -INFINITY}, p).result.token == 0);
    REQUIRE(HostFp32({1.0f, INFINITY, INFINITY}, p).result.token == 1);
  }
  REQUIRE(rows == 96);
}

TEST_CASE("penalties and temperature give the CPU's processed logits", "[kernels][sampling]") {
  std::mt19937_64 rng(12);
  for (float temperature : {0.5f, 1.0f, 1.7f}) {
    for (int history : {0, 1, 40, 700}) {
      const int32_t vocab = 1000;
      std::vector<float> logits = RandomLogits(vocab, LogitsShape{2.0f, 1, 2, 1, true}, &rng);
      std::vector<int32_t> prompt, output;
      RandomHistory(vocab, history, history / 2 + 1, &rng, &prompt, &output);
      for (SampleRowParams p : {SampleRowParams{}, Penalized(SampleRowParams{})}) {
        p.temperature = temperature;
        p.repetition_penalty = history % 2 ? 0.8f : p.repetition_penalty;  // < 1 too
        const HostSample h = HostFp32(logits, p, prompt, output);
        const CpuSample cpu = RunCpuSampler(logits, p, prompt, output);
        int64_t bad = -1;
        INFO("temperature " << temperature << " history " << history);
        REQUIRE(SameFloats(h.processed, cpu.processed, &bad));
        REQUIRE(h.counts_zero_after);
      }
    }
  }
}

TEST_CASE("top-k, top-p and min-p draws stay in the CPU's survivor set", "[kernels][sampling]") {
  std::mt19937_64 rng(13);
  const int32_t vocab = 1000;
  int combos = 0;
  for (int32_t top_k : {0, 1, 5, 50}) {
    for (float top_p : {1.0f, 0.9f, 0.5f, 0.05f}) {
      for (float min_p : {0.0f, 0.05f, 0.3f}) {
        for (bool bf16 : {false, true}) {
          std::vector<float> logits = RandomLogits(vocab, LogitsShape{2.0f, 3, 1, 1}, &rng);
          std::vector<uint16_t> codes;
          std::vector<float> widened = logits;
          if (bf16) ToBf16(logits, &codes, &widened);  // many ties at every boundary
          SampleRowParams p;
          p.temperature = 0.8f;
          p.top_k = top_k;
          p.top_p = top_p;
          p.min_p = min_p;
          p.seed = rng();
          const CpuSample cpu = RunCpuSampler(widened, p, {}, {});
          const Survivors s = SurvivorSets(cpu.processed, p);
          INFO("top_k " << top_k << " top_p " << top_p << " min_p " << min_p << " bf16 " << bf16
                        << " survivors " << s.num_must << ".." << s.num_may);
          std::map<int32_t, int> seen;
          constexpr int kDraws = 200;
          for (int step = 0; step < kDraws; ++step) {
            p.step = static_cast<uint64_t>(step);
            const HostSample h =
                bf16 ? RunHostSampler(codes.data(), ActDtype::kBf16, vocab, p, {}, {})
                     : HostFp32(logits, p);
            REQUIRE(s.may[h.result.token]);
            ++seen[h.result.token];
            // The reference agrees with the CPU sampler's own draws.
            REQUIRE(s.may[RunCpuSampler(widened, p, {}, {}, 1000 + step).token]);
          }
          // Every survivor with at least 10% of the mass shows up.
          double mass = 0.0;
          float max_logit = -INFINITY;
          for (float l : cpu.processed) max_logit = std::max(max_logit, l);
          for (int32_t i = 0; i < vocab; ++i) {
            if (s.must[i]) mass += std::exp(static_cast<double>(cpu.processed[i]) - max_logit);
          }
          for (int32_t i = 0; i < vocab; ++i) {
            const double prob =
                s.must[i] ? std::exp(static_cast<double>(cpu.processed[i]) - max_logit) / mass : 0;
            if (prob >= 0.1) REQUIRE(seen[i] > 0);
          }
          ++combos;
        }
      }
    }
  }
  REQUIRE(combos == 96);
}

TEST_CASE("draws follow the softmax distribution", "[kernels][sampling]") {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.0f};
  SampleRowParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  constexpr int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int step = 0; step < kDraws; ++step) {
    p.step = static_cast<uint64_t>(step);
    ++counts[HostFp32(logits, p).result.token];
  }
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  for (size_t i = 0; i < logits.size(); ++i) {
    const double prob = std::exp(static_cast<double>(logits[i])) / z;
    const double sigma = std::sqrt(kDraws * prob * (1 - prob));
    INFO("token " << i << " count " << counts[i] << " expected " << kDraws * prob);
    REQUIRE(std::abs(counts[i] - kDraws * prob) < 5 * sigma);
  }
}

TEST_CASE("a draw depends on the seed and step only", "[kernels][sampling]") {
  std::mt19937_64 rng(14);
  const std::vector<float> logits = RandomLogits(5000, LogitsShape{1.0f}, &rng);
  SampleRowParams p;
  p.top_p = 0.95f;
  p.seed = 1234;
  std::vector<int32_t> first;
  for (int step = 0; step < 50; ++step) {
    p.step = static_cast<uint64_t>(step);
    first.push_back(HostFp32(logits, p).result.token);
  }
  std::vector<int32_t> again, other_seed;
  for (int step = 0; step < 50; ++step) {
    p.step = static_cast<uint64_t>(step);
    p.seed = 1234;
    again.push_back(HostFp32(logits, p).result.token);
    p.seed = 1235;
    other_seed.push_back(HostFp32(logits, p).result.token);
  }
  REQUIRE(again == first);
  REQUIRE(other_seed != first);
}

TEST_CASE("logprobs equal the CPU's raw logprobs", "[kernels][sampling]") {
  std::mt19937_64 rng(15);
  for (int32_t vocab : {7, 300, 50000}) {
    for (int32_t n : {0, 1, 5, 20}) {
      for (bool greedy : {true, false}) {
        std::vector<float> logits = RandomLogits(vocab, LogitsShape{4.0f, 3, 1, 1, true}, &rng);
        std::vector<int32_t> prompt, output;
        RandomHistory(vocab, 10, 10, &rng, &prompt, &output);
        SampleRowParams p = Penalized(SampleRowParams{});  // logprobs are taken before these
        p.temperature = greedy ? 0.0f : 1.0f;
        p.num_top_logprobs = n;
        p.top_k = greedy ? 0 : 1;  // non-greedy yet deterministic: the CPU's token is ours
        const HostSample h = HostFp32(logits, p, prompt, output);
        const CpuSample cpu = RunCpuSampler(logits, p, prompt, output);
        INFO("vocab " << vocab << " n " << n << " greedy " << greedy);
        REQUIRE(h.result.token == cpu.token);
        REQUIRE(cpu.logprobs.chosen.token == cpu.token);
        auto close = [](float got, float want) {
          if (std::isinf(want)) return got == want;
          return std::abs(got - want) <= 1e-5f;
        };
        REQUIRE(close(h.result.logprob, cpu.logprobs.chosen.logprob));
        REQUIRE(static_cast<int32_t>(cpu.logprobs.top.size()) == std::min(n, vocab));
        for (int32_t j = 0; j < kMaxTopLogprobs; ++j) {
          if (j < static_cast<int32_t>(cpu.logprobs.top.size())) {
            REQUIRE(h.result.top_ids[j] == cpu.logprobs.top[j].token);
            REQUIRE(close(h.result.top_logprobs[j], cpu.logprobs.top[j].logprob));
          } else {
            REQUIRE(h.result.top_ids[j] == -1);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cuda::sample_row
