// Device sampling against the CPU sampler and against the same algorithm run
// on the host (kernels/cuda/sampling/sample_row.cuh with a one-thread team):
//   - every row's token, processed logits and top-n ids equal the host run's
//     exactly (the device runs the same code; its sums are integer or fixed
//     order), logprobs to 1e-5;
//   - greedy tokens equal the CPU sampler's exactly, ties and NaN included;
//     processed logits equal the CPU's bit for bit (penalties, temperature);
//   - non-greedy tokens lie in the CPU's survivor set (top-k/top-p/min-p) at
//     every step; raw logprobs equal the CPU's to 1e-5;
//   - a row's result does not depend on its batch; draws follow the softmax;
//   - the counts workspace is left all zero.
#include "kernels/cuda/sampling/sample.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/plan/sampling_batch.h"
#include "tests/kernels/cuda/device_buffer.h"
#include "tests/kernels/sampling_reference.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::CpuSample;
using ::kvserve::testing::DeviceBuffer;
using ::kvserve::testing::HostSample;
using ::kvserve::testing::LogitsShape;
using ::kvserve::testing::RequireBadField;
using ::kvserve::testing::RequireOk;

// One logits row with its history and parameters; `stored` holds the row
// as the GPU reads it (fp32 floats or 16-bit codes), `widened` the floats
// those stand for.
struct Row {
  std::vector<float> widened;
  std::vector<uint8_t> stored;
  SampleRowParams params;
  std::vector<int32_t> prompt, output;
};

// Sets logit i of a row (NaN and inf survive every dtype).
void SetLogit(Row* row, ActDtype dtype, int32_t i, float value) {
  if (dtype == ActDtype::kFp32) {
    std::memcpy(&row->stored[4 * i], &value, 4);
  } else {
    const uint16_t c =
        dtype == ActDtype::kFp16 ? kv_encode::FloatToFp16(value) : kv_encode::FloatToBf16(value);
    std::memcpy(&row->stored[2 * i], &c, 2);
  }
  row->widened[i] = sample_row::LoadLogit(row->stored.data(), dtype, i);
}

Row MakeRow(int32_t vocab, ActDtype dtype, const LogitsShape& shape, const SampleRowParams& params,
            int history, std::mt19937_64* rng) {
  Row r;
  r.params = params;
  const std::vector<float> x = ::kvserve::testing::RandomLogits(vocab, shape, rng);
  ::kvserve::testing::RandomHistory(vocab, history, history / 2, rng, &r.prompt, &r.output);
  r.widened.resize(vocab);
  r.stored.resize(static_cast<size_t>(vocab) * ActDtypeSize(dtype));
  for (int32_t i = 0; i < vocab; ++i) SetLogit(&r, dtype, i, x[i]);
  return r;
}

struct GpuRun {
  std::vector<SampleRowResult> results;
  std::vector<float> processed;  // [rows][vocab]
  bool counts_zero = false;
};

GpuRun RunGpu(const std::vector<Row>& rows, ActDtype dtype, int32_t vocab) {
  const int32_t num_rows = static_cast<int32_t>(rows.size());
  const int64_t stride = vocab + 3;  // padded logits rows
  const int64_t elem = ActDtypeSize(dtype);
  std::vector<uint8_t> logits(num_rows * stride * elem, 0xff);
  SamplingBatch batch(vocab);
  for (int32_t r = 0; r < num_rows; ++r) {
    std::memcpy(&logits[r * stride * elem], rows[r].stored.data(), rows[r].stored.size());
    RequireOk(batch.AddRow(rows[r].params, rows[r].prompt, rows[r].output));
  }
  std::vector<uint8_t> packed(batch.PackedBytes());
  batch.PackInto(packed.data());
  const SampleWorkspaceLayout ws = SampleWorkspaceFor(num_rows, vocab);

  DeviceBuffer d_logits(logits.size()), d_packed(packed.size() + 64), d_ws(ws.bytes);
  DeviceBuffer d_results(num_rows * sizeof(SampleRowResult));
  d_logits.Upload(logits);
  if (!packed.empty()) d_packed.Upload(packed);
  REQUIRE_CUDA(cudaMemset(d_ws.as<uint8_t>(), 0xff, ws.bytes));  // poison processed
  REQUIRE_CUDA(cudaMemset(d_ws.as<uint8_t>(ws.counts_offset), 0, int64_t{num_rows} * vocab * 4));
  SampleParams p;
  p.logits = d_logits.as<uint8_t>();
  p.logits_stride = stride;
  p.dtype = dtype;
  p.vocab = vocab;
  p.num_rows = num_rows;
  p.rows = reinterpret_cast<const SampleRowParams*>(d_packed.as<uint8_t>());
  p.history =
      batch.history().empty()
          ? nullptr
          : reinterpret_cast<const int32_t*>(d_packed.as<uint8_t>(batch.HistoryByteOffset()));
  p.processed = reinterpret_cast<float*>(d_ws.as<uint8_t>(ws.processed_offset));
  p.counts = reinterpret_cast<int32_t*>(d_ws.as<uint8_t>(ws.counts_offset));
  p.results = d_results.as<SampleRowResult>();
  RequireOk(SampleTokens(p, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());

  GpuRun run;
  run.results = d_results.Download<SampleRowResult>(num_rows);
  run.processed = std::vector<float>(int64_t{num_rows} * vocab);
  REQUIRE_CUDA(cudaMemcpy(run.processed.data(), d_ws.as<uint8_t>(ws.processed_offset),
                          run.processed.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> counts(int64_t{num_rows} * vocab);
  REQUIRE_CUDA(cudaMemcpy(counts.data(), d_ws.as<uint8_t>(ws.counts_offset), counts.size() * 4,
                          cudaMemcpyDeviceToHost));
  run.counts_zero = std::all_of(counts.begin(), counts.end(), [](int32_t c) { return c == 0; });
  return run;
}

bool Close(float got, float want) {
  if (std::isinf(want) || std::isnan(want))
    return got == want || (std::isnan(got) && std::isnan(want));
  return std::fabs(got - want) <= 1e-5f;
}

// log_softmax(raw)[token] in double, NaN as -inf.
float RawLogprob(const std::vector<float>& raw, int32_t token) {
  double max = -INFINITY;
  for (float v : raw) {
    if (!std::isnan(v)) max = std::max(max, static_cast<double>(v));
  }
  double sum = 0.0;
  for (float v : raw) {
    if (!std::isnan(v)) sum += std::exp(static_cast<double>(v) - max);
  }
  const float v = raw[token];
  return std::isnan(v) ? -INFINITY : static_cast<float>(v - (max + std::log(sum)));
}

// Every check of the file header, for one row of one run.
void CheckRow(const Row& row, const GpuRun& run, int32_t r, ActDtype dtype, int32_t vocab) {
  const SampleRowResult& got = run.results[r];
  const std::vector<float> processed(run.processed.begin() + int64_t{r} * vocab,
                                     run.processed.begin() + int64_t{r + 1} * vocab);
  const SampleRowParams& p = row.params;
  INFO("row " << r << " temperature " << p.temperature << " top_k " << p.top_k << " top_p "
              << p.top_p << " min_p " << p.min_p << " step " << p.step << " logprobs "
              << p.num_top_logprobs);
  REQUIRE(got.token >= 0);
  REQUIRE(got.token < vocab);

  // The same algorithm on the host: identical token, processed logits, top ids.
  const HostSample host = ::kvserve::testing::RunHostSampler(row.stored.data(), dtype, vocab, p,
                                                             row.prompt, row.output);
  REQUIRE(got.token == host.result.token);
  int64_t bad = -1;
  REQUIRE(::kvserve::testing::SameFloats(processed, host.processed, &bad));
  for (int j = 0; j < kMaxTopLogprobs; ++j) {
    REQUIRE(got.top_ids[j] == host.result.top_ids[j]);
    REQUIRE(Close(got.top_logprobs[j], host.result.top_logprobs[j]));
  }

  // The CPU sampler.
  const CpuSample cpu = ::kvserve::testing::RunCpuSampler(row.widened, p, row.prompt, row.output);
  INFO("first processed logit differing from the CPU's: " << bad);
  REQUIRE(::kvserve::testing::SameFloats(processed, cpu.processed, &bad));
  if (p.temperature == 0.0f) {
    REQUIRE(got.token == cpu.token);
  } else {
    REQUIRE(::kvserve::testing::SurvivorSets(cpu.processed, p).may[got.token]);
  }
  if (p.num_top_logprobs >= 0) {
    REQUIRE(static_cast<int>(cpu.logprobs.top.size()) == std::min(p.num_top_logprobs, vocab));
    for (size_t j = 0; j < cpu.logprobs.top.size(); ++j) {
      REQUIRE(got.top_ids[j] == cpu.logprobs.top[j].token);
      REQUIRE(Close(got.top_logprobs[j], cpu.logprobs.top[j].logprob));
    }
    if (got.token == cpu.token) REQUIRE(Close(got.logprob, cpu.logprobs.chosen.logprob));
    REQUIRE(Close(got.logprob, RawLogprob(row.widened, got.token)));
    REQUIRE(Close(got.logprob, host.result.logprob));
  } else {
    REQUIRE(std::isnan(got.logprob));
  }
}

std::vector<SampleRowParams> Mix(std::mt19937_64* rng) {
  std::vector<SampleRowParams> mix(12);
  for (SampleRowParams& p : mix) p.seed = (*rng)();
  mix[0].temperature = 0.0f;
  mix[1].temperature = 0.0f;
  mix[1].repetition_penalty = 1.3f;
  mix[1].frequency_penalty = 0.3f;
  mix[1].presence_penalty = 0.2f;
  mix[1].num_top_logprobs = 5;
  mix[2].temperature = 0.7f;
  mix[2].num_top_logprobs = 20;
  mix[3].top_k = 40;
  mix[4].top_p = 0.9f;
  mix[5].min_p = 0.1f;
  mix[5].temperature = 1.3f;
  mix[6].top_k = 100;
  mix[6].top_p = 0.8f;
  mix[6].min_p = 0.02f;
  mix[6].repetition_penalty = 0.9f;
  mix[6].frequency_penalty = -0.5f;
  mix[6].num_top_logprobs = 3;
  mix[7].top_k = 1;
  mix[7].num_top_logprobs = 0;
  mix[8].top_p = 0.05f;
  mix[9].temperature = 0.0f;   // an all-NaN row (see MixedRows)
  mix[10].temperature = 1.0f;  // a row holding +inf: degenerate, the argmax
  mix[11].top_k = 7;           // many ties
  mix[11].temperature = 0.5f;
  return mix;
}

std::vector<Row> MixedRows(int32_t vocab, ActDtype dtype, std::mt19937_64* rng) {
  const std::vector<SampleRowParams> mix = Mix(rng);
  std::vector<Row> rows;
  for (size_t i = 0; i < mix.size(); ++i) {
    LogitsShape shape{3.0f, static_cast<int>(i % 3), static_cast<int>(i % 2), 1, i % 4 == 0};
    if (i == 11) shape = LogitsShape{0.05f, 20};  // after rounding: ties everywhere
    Row row = MakeRow(vocab, dtype, shape, mix[i], 20 + static_cast<int>(i), rng);
    if (i == 9) {
      for (int32_t j = 0; j < vocab; ++j) SetLogit(&row, dtype, j, NAN);
    }
    if (i == 10) SetLogit(&row, dtype, vocab / 2, INFINITY);
    rows.push_back(std::move(row));
  }
  return rows;
}

TEST_CASE("SampleTokens matches the host run and the CPU sampler on mixed batches", "[gpu]") {
  std::mt19937_64 rng(21);
  for (ActDtype dtype : {ActDtype::kFp32, ActDtype::kBf16, ActDtype::kFp16}) {
    for (int32_t vocab : {512, 32000, 128256}) {
      std::vector<Row> rows = MixedRows(vocab, dtype, &rng);
      const int steps = vocab == 512 ? 48 : (vocab == 32000 ? 6 : 2);
      for (int step = 0; step < steps; ++step) {
        for (Row& row : rows) row.params.step = static_cast<uint64_t>(step);
        const GpuRun run = RunGpu(rows, dtype, vocab);
        INFO("dtype " << static_cast<int>(dtype) << " vocab " << vocab << " step " << step);
        REQUIRE(run.counts_zero);
        for (int32_t r = 0; r < static_cast<int32_t>(rows.size()); ++r) {
          CheckRow(rows[r], run, r, dtype, vocab);
        }
        REQUIRE(run.results[9].token == 0);           // all NaN
        REQUIRE(run.results[10].token == vocab / 2);  // +inf wins
      }
    }
  }
}

TEST_CASE("SampleTokens gives a row the same result whatever its batch", "[gpu]") {
  std::mt19937_64 rng(22);
  const int32_t vocab = 32000;
  std::vector<Row> rows = MixedRows(vocab, ActDtype::kBf16, &rng);
  const GpuRun together = RunGpu(rows, ActDtype::kBf16, vocab);
  const GpuRun again = RunGpu(rows, ActDtype::kBf16, vocab);
  std::vector<Row> reversed(rows.rbegin(), rows.rend());
  const GpuRun backwards = RunGpu(reversed, ActDtype::kBf16, vocab);
  const int32_t n = static_cast<int32_t>(rows.size());
  for (int32_t r = 0; r < n; ++r) {
    INFO("row " << r);
    const GpuRun alone = RunGpu({rows[r]}, ActDtype::kBf16, vocab);
    REQUIRE(std::memcmp(&alone.results[0], &together.results[r], sizeof(SampleRowResult)) == 0);
    REQUIRE(std::memcmp(&again.results[r], &together.results[r], sizeof(SampleRowResult)) == 0);
    REQUIRE(std::memcmp(&backwards.results[n - 1 - r], &together.results[r],
                        sizeof(SampleRowResult)) == 0);
  }
}

TEST_CASE("SampleTokens draws follow the softmax distribution", "[gpu]") {
  // 4096 rows of one small distribution in one launch, step = row index.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.0f};
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<Row> rows(4096);
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].widened = logits;
    rows[r].stored.resize(vocab * 4);
    std::memcpy(rows[r].stored.data(), logits.data(), vocab * 4);
    rows[r].params.seed = 99;
    rows[r].params.step = r;
  }
  const GpuRun run = RunGpu(rows, ActDtype::kFp32, vocab);
  std::vector<int> counts(vocab, 0);
  for (const SampleRowResult& res : run.results) ++counts[res.token];
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  for (int32_t i = 0; i < vocab; ++i) {
    const double prob = std::exp(static_cast<double>(logits[i])) / z, n = rows.size();
    INFO("token " << i << " count " << counts[i] << " expected " << n * prob);
    REQUIRE(std::abs(counts[i] - n * prob) < 5 * std::sqrt(n * prob * (1 - prob)));
  }
  // And each equals the host run of its row.
  for (size_t r = 0; r < rows.size(); r += 97) {
    REQUIRE(run.results[r].token == ::kvserve::testing::RunHostSampler(rows[r].stored.data(),
                                                                       ActDtype::kFp32, vocab,
                                                                       rows[r].params, {}, {})
                                        .result.token);
  }
}

TEST_CASE("SampleTokens rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(1 << 16);
  SampleParams p;
  p.logits = buffer.as<float>();
  p.vocab = 16;
  p.num_rows = 1;
  p.rows = reinterpret_cast<const SampleRowParams*>(buffer.as<uint8_t>());
  p.processed = buffer.as<float>(1024);
  p.counts = buffer.as<int32_t>(2048);
  p.results = reinterpret_cast<SampleRowResult*>(buffer.as<uint8_t>(12288));
  SECTION("vocab") {
    p.vocab = kMaxSampleVocab + 1;
    RequireBadField(SampleTokens(p, nullptr), "vocab");
  }
  SECTION("logits_stride") {
    p.logits_stride = 8;
    RequireBadField(SampleTokens(p, nullptr), "logits_stride");
  }
  SECTION("counts") {
    p.counts = nullptr;
    RequireBadField(SampleTokens(p, nullptr), "counts");
  }
  SECTION("no rows launch nothing") {
    p.num_rows = 0;
    p.logits = nullptr;
    RequireOk(SampleTokens(p, nullptr));
  }
}

}  // namespace
}  // namespace kvserve::cuda
