// The device sampler's kernel source (kernels/cuda/sampling/sample_kernel.cuh: the
// thread-block team, its reductions, warp-segmented ordered search, ballots
// and atomics), run on the CPU by cuda_sim, against the same row algorithm
// run with a one-thread team (tests/kernels/sample_row_test.cc checks that
// one against the CPU sampler): tokens, processed logits and top-n ids must
// be identical, logprobs equal to 1e-6, the counts workspace zero after.
// Small vocabularies only (512 simulated threads per row).
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim_more.h"  // first: the shims the kernel source needs
#include "kernels/cuda/sampling/sample_kernel.cuh"
// clang-format on

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/plan/sampling_batch.h"
#include "tests/kernels/sample_row_host.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::HostSample;
using ::kvserve::testing::LogitsShape;

struct Row {
  std::vector<uint8_t> stored;  // the row as the kernel reads it (dtype)
  SampleRowParams params;
  std::vector<int32_t> prompt, output;
};

std::vector<uint8_t> Store(const std::vector<float>& x, ActDtype dtype) {
  std::vector<uint8_t> out(x.size() * ActDtypeSize(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == ActDtype::kFp32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      const uint16_t c =
          dtype == ActDtype::kFp16 ? kv_encode::FloatToFp16(x[i]) : kv_encode::FloatToBf16(x[i]);
      std::memcpy(&out[2 * i], &c, 2);
    }
  }
  return out;
}

std::vector<Row> Rows(int32_t vocab, ActDtype dtype, std::mt19937_64* rng) {
  std::vector<SampleRowParams> params(9);
  for (SampleRowParams& p : params) {
    p.seed = (*rng)();
    p.step = (*rng)() % 1000;
  }
  params[0].temperature = 0.0f;
  params[0].num_top_logprobs = 20;
  params[1].temperature = 0.0f;
  params[1].repetition_penalty = 1.4f;
  params[1].frequency_penalty = 0.5f;
  params[1].presence_penalty = -0.3f;
  params[2].num_top_logprobs = 3;
  params[3].top_k = 5;
  params[4].top_p = 0.7f;
  params[4].repetition_penalty = 0.8f;
  params[5].min_p = 0.1f;
  params[5].temperature = 1.5f;
  params[6].top_k = 20;
  params[6].top_p = 0.5f;
  params[6].min_p = 0.05f;
  params[6].num_top_logprobs = 0;
  params[7].top_p = 0.01f;
  params[8].temperature = 0.0f;  // all NaN below
  std::vector<Row> rows;
  for (size_t i = 0; i < params.size(); ++i) {
    Row r;
    r.params = params[i];
    const LogitsShape shape{i % 2 ? 0.1f : 3.0f, static_cast<int>(i % 3), static_cast<int>(i % 2),
                            1, i % 4 == 0};
    std::vector<float> x = ::kvserve::testing::RandomLogits(vocab, shape, rng);
    if (i == 8) std::fill(x.begin(), x.end(), NAN);
    r.stored = Store(x, dtype);
    ::kvserve::testing::RandomHistory(vocab, 12, 7, rng, &r.prompt, &r.output);
    rows.push_back(std::move(r));
  }
  return rows;
}

TEST_CASE("simulated device sampler equals the host run of its algorithm", "[cuda_sim]") {
  std::mt19937_64 rng(7);
  for (ActDtype dtype : {ActDtype::kFp32, ActDtype::kBf16}) {
    for (int32_t vocab : {1, 7, 300, 2500}) {
      INFO("dtype " << static_cast<int>(dtype) << " vocab " << vocab);
      const std::vector<Row> rows = Rows(vocab, dtype, &rng);
      const int32_t n = static_cast<int32_t>(rows.size());
      const int64_t stride = vocab + 1, elem = ActDtypeSize(dtype);
      std::vector<uint8_t> logits(n * stride * elem, 0xff);
      SamplingBatch batch(vocab);
      for (int32_t r = 0; r < n; ++r) {
        std::memcpy(&logits[r * stride * elem], rows[r].stored.data(), rows[r].stored.size());
        REQUIRE(batch.AddRow(rows[r].params, rows[r].prompt, rows[r].output).ok());
      }
      std::vector<float> processed(int64_t{n} * vocab, NAN);
      std::vector<int32_t> counts(int64_t{n} * vocab, 0);
      std::vector<SampleRowResult> results(n);
      SampleParams p;
      p.logits = logits.data();
      p.logits_stride = stride;
      p.dtype = dtype;
      p.vocab = vocab;
      p.num_rows = n;
      p.rows = batch.rows().data();
      p.history = batch.history().data();
      p.processed = processed.data();
      p.counts = counts.data();
      p.results = results.data();
      cuda_sim::Launch(sample_detail::SampleKernel, dim3(n), sample_detail::kThreads, nullptr, 0,
                       p);
      REQUIRE(std::all_of(counts.begin(), counts.end(), [](int32_t c) { return c == 0; }));
      for (int32_t r = 0; r < n; ++r) {
        INFO("row " << r);
        const HostSample host = ::kvserve::testing::RunHostSampler(
            rows[r].stored.data(), dtype, vocab, rows[r].params, rows[r].prompt, rows[r].output);
        const SampleRowResult& got = results[r];
        REQUIRE(got.token == host.result.token);
        const std::vector<float> row(processed.begin() + int64_t{r} * vocab,
                                     processed.begin() + int64_t{r + 1} * vocab);
        int64_t bad = -1;
        REQUIRE(::kvserve::testing::SameFloats(row, host.processed, &bad));
        auto close = [](float a, float b) {
          return a == b || (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= 1e-6f;
        };
        REQUIRE(close(got.logprob, host.result.logprob));
        for (int j = 0; j < kMaxTopLogprobs; ++j) {
          REQUIRE(got.top_ids[j] == host.result.top_ids[j]);
          REQUIRE(close(got.top_logprobs[j], host.result.top_logprobs[j]));
        }
      }
      REQUIRE(results[8].token == 0);  // all NaN
    }
  }
}

}  // namespace
}  // namespace kvserve::cuda
