// e2e_bench: the CUDA model runner end to end on a real model shape
// (default dummy:llama-3-8b in bf16, weights generated on the device).
//
// 1. Read bandwidth of the device, measured in the same run
//    (kernels/cuda/read_bandwidth.h), for the roofline ratios.
// 2. Decode throughput: for each KV format (bf16, int8, k8v4, int4), batch
//    (1, 32, 64, 128) and context (1024, 4096), the time of a decode step
//    (Forward + device sampling, as the engine runs it; pure decode steps
//    replay CUDA graphs) and tokens/s, next to the roofline step time
//    (weight bytes + the KV bytes the step reads) / bandwidth. Every sequence
//    has its own blocks, in a shuffled order, so attention reads pages
//    scattered over the pool as a served workload does.
// 3. Capacity: the largest batch of 4096-token sequences whose weights,
//    activations and KV pool fit in 80% of device memory, per KV format,
//    measured (a runner is built with that pool and runs decode steps at
//    that batch) next to `kvserve plan`'s prediction (cache/sizing/capacity_plan.h,
//    which counts weights but not activations).
//
// --weight-dtype fp8_e4m3 (model.weight_dtype) times the fp8 GEMMs: dummy
// weights are generated and quantized on the device; a checkpoint's are
// quantized on the host once (model/loader/quantize_weights.h) for every
// runner built.
//
//   e2e_bench [--json PATH] [--model dummy:llama-3-8b] [--dtype bf16] [--weight-dtype auto]
//             [--kv bf16,int8,k8v4,int4] [--batches 1,32,64,128]
//             [--contexts 1024,4096] [--steps 20] [--capacity-context 4096]
//             [--capacity-fraction 0.8] [--no-capacity]
//
// Prints a table and writes JSON. Exits 77 with a message when there is no
// CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cache/format/kv_format.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/capacity_plan.h"
#include "kernels/cuda/read_bandwidth.h"
#include "model/cpu/cpu_threads.h"
#include "model/cuda/cuda_model_runner.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/runner_factory.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string json_path;
  std::string model = "dummy:llama-3-8b";
  std::string dtype = "bf16";
  std::string weight_dtype = "auto";
  std::vector<KvDtype> kv = {KvDtype::kBf16, KvDtype::kInt8, KvDtype::kK8V4, KvDtype::kInt4};
  std::vector<int32_t> batches = {1, 32, 64, 128};
  std::vector<int32_t> contexts = {1024, 4096};
  int steps = 20;
  int32_t capacity_context = 4096;
  double capacity_fraction = 0.8;
  bool capacity = true;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "e2e_bench: %s\n", what.c_str());
  std::exit(1);
}

std::vector<int32_t> Ints(const std::string& text) {
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int32_t v;
    if (!absl::SimpleAtoi(part, &v) || v < 1) Die("not a list of positive integers: " + text);
    out.push_back(v);
  }
  return out;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--json") {
      f.json_path = value();
    } else if (a == "--model") {
      f.model = value();
    } else if (a == "--dtype") {
      f.dtype = value();
    } else if (a == "--weight-dtype") {
      f.weight_dtype = value();
      absl::StatusOr<WeightQuantSpec> q = ParseWeightQuant(f.weight_dtype);
      if (!q.ok()) Die(std::string(q.status().message()));
    } else if (a == "--kv") {
      f.kv.clear();
      for (absl::string_view name : absl::StrSplit(value(), ',')) {
        absl::StatusOr<KvDtype> d = ParseKvDtype(std::string(name));
        if (!d.ok()) Die(std::string(d.status().message()));
        f.kv.push_back(*d);
      }
    } else if (a == "--batches") {
      f.batches = Ints(value());
    } else if (a == "--contexts") {
      f.contexts = Ints(value());
    } else if (a == "--steps") {
      f.steps = Ints(value()).front();
    } else if (a == "--capacity-context") {
      f.capacity_context = Ints(value()).front();
    } else if (a == "--capacity-fraction") {
      if (!absl::SimpleAtod(value(), &f.capacity_fraction)) Die("--capacity-fraction: a number");
    } else if (a == "--no-capacity") {
      f.capacity = false;
    } else {
      Die("unknown flag " + a + " (see the comment at the top of bench/gpu/e2e_bench.cc)");
    }
  }
  return f;
}

// A decode step of `batch` sequences at cache length `context` (the new
// token's K/V goes to the last slot). Sequence b owns blocks
// table[b * per_seq .. (b + 1) * per_seq) of a shuffled permutation.
BatchInput DecodeBatch(int32_t batch, int32_t context, int32_t block_size, int32_t vocab,
                       const std::vector<int32_t>& permutation, std::mt19937& rng) {
  const int32_t per_seq = BlocksForTokens(context, block_size);
  BatchInput b;
  b.Clear();
  b.max_blocks_per_seq = per_seq;
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t* blocks = permutation.data() + static_cast<int64_t>(s) * per_seq;
    const int32_t i = context - 1;
    b.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
    b.positions.push_back(i);
    b.slot_mapping.push_back(int64_t{blocks[i / block_size]} * block_size + i % block_size);
    b.query_start.push_back(s + 1);
    b.context_len.push_back(context);
    b.block_table.insert(b.block_table.end(), blocks, blocks + per_seq);
    b.logits_rows.push_back(s);
  }
  return b;
}

struct StepTiming {
  double median_ms = 0;
  double tokens_per_s = 0;
  int64_t graph_steps = 0;
};

// Warm-up, then `steps` timed steps of Forward + greedy device sampling.
StepTiming TimeDecode(CudaModelRunner& runner, int32_t batch, int32_t context, int steps,
                      int32_t blocks_in_pool, std::mt19937& rng) {
  const ModelConfig& c = runner.config();
  const int32_t bs = runner.kv_format().block_size();
  std::vector<int32_t> permutation(blocks_in_pool);
  std::iota(permutation.begin(), permutation.end(), 0);
  std::shuffle(permutation.begin(), permutation.end(), rng);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<SampleRow> rows(batch);
  for (int32_t s = 0; s < batch; ++s) {
    rows[s].params = &greedy;
    rows[s].logits_index = s;
  }
  std::vector<SampledToken> out(batch);
  std::vector<double> ms;
  const int64_t graphs_before = runner.counters().graph_steps;
  for (int i = 0; i < steps + 3; ++i) {
    const BatchInput b = DecodeBatch(batch, context, bs, c.vocab_size, permutation, rng);
    const auto t0 = Clock::now();
    if (absl::Status st = runner.Forward(b); !st.ok()) Die(std::string(st.message()));
    if (absl::Status st = runner.Sample(rows, out); !st.ok()) Die(std::string(st.message()));
    const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  StepTiming r;
  r.median_ms = ms[ms.size() / 2];
  r.tokens_per_s = batch / (r.median_ms * 1e-3);
  r.graph_steps = runner.counters().graph_steps - graphs_before;
  return r;
}

RunnerOptions BaseOptions(const Flags& f, KvDtype kv) {
  RunnerOptions o;
  o.device = "cuda";
  o.dtype = f.dtype;
  o.weight_dtype = f.weight_dtype;
  o.kv_dtype = kv;
  o.block_size = 16;
  o.max_num_batched_tokens = 512;
  return o;
}

std::unique_ptr<CudaModelRunner> Build(const LlamaWeights& shapes, const RunnerOptions& o) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(shapes, o);
  if (!r.ok()) Die(std::string(r.status().message()));
  return std::unique_ptr<CudaModelRunner>(static_cast<CudaModelRunner*>(r->release()));
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  using namespace kvserve;
  const Flags f = ParseFlags(argc, argv);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("e2e_bench: skipped, no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaSetDevice(0);
  absl::StatusOr<double> bandwidth = cuda::MeasureReadBandwidth(int64_t{4} << 30, 10, nullptr);
  if (!bandwidth.ok()) Die(std::string(bandwidth.status().message()));
  const WeightQuantSpec quant = *ParseWeightQuant(f.weight_dtype);
  absl::StatusOr<LoadedModel> loaded = LoadModel(f.model, "", /*defer_dummy_weights=*/true);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  if (quant.fp8() && loaded->weights.tok_embeddings.data != nullptr) {
    // Once for every runner below (each would otherwise quantize its copy).
    if (absl::Status s = QuantizeWeights(quant, &loaded->weights, DefaultCpuThreads()); !s.ok()) {
      Die(std::string(s.message()));
    }
  }
  const LlamaWeights& shapes = loaded->weights;
  const ModelConfig& c = shapes.config;
  std::printf("e2e_bench: %s on %s (%.1f GiB), %s weights (%s); read bandwidth %.0f GB/s\n",
              f.model.c_str(), prop.name, prop.totalGlobalMem / double(1 << 30), f.dtype.c_str(),
              f.weight_dtype.c_str(), *bandwidth);

  json out;
  out["device"] = prop.name;
  out["device_memory_bytes"] = static_cast<int64_t>(prop.totalGlobalMem);
  out["model"] = f.model;
  out["dtype"] = f.dtype;
  out["weight_dtype"] = f.weight_dtype;
  out["read_bandwidth_gbps"] = *bandwidth;
  out["decode"] = json::array();
  std::mt19937 rng(1);
  const int32_t max_batch = *std::max_element(f.batches.begin(), f.batches.end());
  const int32_t max_context = *std::max_element(f.contexts.begin(), f.contexts.end());

  std::printf("\n%-6s %6s %8s %10s %12s %12s %8s %7s\n", "kv", "batch", "context", "step ms",
              "tokens/s", "roofline ms", "ratio", "graphs");
  int64_t weight_bytes = 0;
  for (KvDtype kv : f.kv) {
    RunnerOptions o = BaseOptions(f, kv);
    o.max_num_seqs = max_batch;
    o.max_model_len = max_context;
    o.num_blocks = max_batch * BlocksForTokens(max_context, 16);
    std::unique_ptr<CudaModelRunner> runner = Build(shapes, o);
    const RunnerMemoryInfo& m = runner->memory_info();
    weight_bytes = m.weight_bytes;
    const int64_t kv_token_bytes = runner->kv_format().bytes_per_token_per_layer() * c.num_layers;
    bool gemm_reported = false;
    for (int32_t batch : f.batches) {
      for (int32_t context : f.contexts) {
        const StepTiming t = TimeDecode(*runner, batch, context, f.steps, m.num_blocks, rng);
        const double bytes =
            static_cast<double>(m.weight_bytes) + double(batch) * context * kv_token_bytes;
        const double roofline_ms = bytes / (*bandwidth * 1e9) * 1e3;
        const double ratio = roofline_ms / t.median_ms;
        std::printf("%-6s %6d %8d %10.3f %12.0f %12.3f %8.2f %7lld\n",
                    std::string(KvDtypeName(kv)).c_str(), batch, context, t.median_ms,
                    t.tokens_per_s, roofline_ms, ratio, static_cast<long long>(t.graph_steps));
        out["decode"].push_back({{"kv_dtype", KvDtypeName(kv)},
                                 {"batch", batch},
                                 {"context", context},
                                 {"step_ms", t.median_ms},
                                 {"tokens_per_s", t.tokens_per_s},
                                 {"bytes_read", bytes},
                                 {"roofline_ms", roofline_ms},
                                 {"roofline_ratio", ratio},
                                 {"graph_steps", t.graph_steps}});
        if (!gemm_reported) {
          // After the first timed steps every decode GEMM shape has a plan.
          gemm_reported = true;
          const CudaModelRunner::GemmStats g = runner->gemm_stats();
          std::printf(
              "%-6s GEMM: %lld shapes, %lld picked by timing, %lld from an earlier runner, "
              "%lld row counts on their own algorithm\n",
              std::string(KvDtypeName(kv)).c_str(), static_cast<long long>(g.shapes),
              static_cast<long long>(g.tuned), static_cast<long long>(g.memo_hits),
              static_cast<long long>(g.invariance_fallbacks));
          out["gemm"][std::string(KvDtypeName(kv))] = {
              {"shapes", g.shapes},
              {"tuned", g.tuned},
              {"memo_hits", g.memo_hits},
              {"invariance_fallbacks", g.invariance_fallbacks}};
        }
      }
    }
  }

  if (f.capacity) {
    out["capacity"] = json::array();
    const int64_t budget = static_cast<int64_t>(f.capacity_fraction * prop.totalGlobalMem);
    const int32_t per_seq = BlocksForTokens(f.capacity_context, 16);
    std::printf("\nLargest batch of %d-token sequences in %.0f%% of device memory (%.1f GiB):\n",
                f.capacity_context, 100 * f.capacity_fraction, budget / double(1 << 30));
    std::printf("%-6s %10s %10s %10s %12s %10s\n", "kv", "measured", "predicted", "vs bf16",
                "tokens/s", "step ms");
    int64_t bf16_batch = 0;
    for (KvDtype kv : f.kv) {
      // Activations grow with the batch (logits, sampler): probe, then size.
      int32_t batch = 256;
      int64_t blocks = 0;
      for (int round = 0; round < 3; ++round) {
        RunnerOptions probe = BaseOptions(f, kv);
        probe.max_num_seqs = batch;
        probe.max_model_len = f.capacity_context;
        probe.num_blocks = per_seq;
        probe.cuda_graphs = false;
        std::unique_ptr<CudaModelRunner> p = Build(shapes, probe);
        const RunnerMemoryInfo& m = p->memory_info();
        blocks = (budget - m.weight_bytes - m.activation_bytes) / m.kv_bytes_per_block;
        const int32_t fits = static_cast<int32_t>(blocks / per_seq);
        if (fits <= batch) {
          batch = fits;
          break;
        }
        batch = fits;
      }
      if (batch < 1) Die("not even one sequence fits the capacity budget");
      RunnerOptions o = BaseOptions(f, kv);
      o.max_num_seqs = batch;
      o.max_model_len = f.capacity_context;
      o.num_blocks = static_cast<int32_t>(int64_t{batch} * per_seq);
      o.cuda_graphs = false;
      std::unique_ptr<CudaModelRunner> runner = Build(shapes, o);
      const StepTiming t =
          TimeDecode(*runner, batch, f.capacity_context, 3, runner->num_blocks(), rng);
      CapacityPlanRequest plan;
      plan.num_layers = c.num_layers;
      plan.num_kv_heads = c.num_kv_heads;
      plan.head_dim = c.head_dim;
      plan.weight_bytes = weight_bytes;
      plan.memory_bytes = budget;
      plan.context_tokens = f.capacity_context;
      plan.block_size = 16;
      int64_t predicted = 0;
      if (absl::StatusOr<std::vector<KvFormatCapacity>> caps = PlanCapacity(plan); caps.ok()) {
        for (const KvFormatCapacity& k : *caps) {
          if (k.dtype == kv) predicted = k.max_seqs;
        }
      }
      if (kv == KvDtype::kBf16) bf16_batch = batch;
      const double vs_bf16 = bf16_batch > 0 ? double(batch) / bf16_batch : 0.0;
      std::printf("%-6s %10d %10lld %10.2f %12.0f %10.3f\n", std::string(KvDtypeName(kv)).c_str(),
                  batch, static_cast<long long>(predicted), vs_bf16, t.tokens_per_s, t.median_ms);
      out["capacity"].push_back({{"kv_dtype", KvDtypeName(kv)},
                                 {"context", f.capacity_context},
                                 {"budget_bytes", budget},
                                 {"measured_max_batch", batch},
                                 {"predicted_max_seqs", predicted},
                                 {"vs_bf16", vs_bf16},
                                 {"tokens_per_s", t.tokens_per_s},
                                 {"step_ms", t.median_ms}});
    }
  }

  if (!f.json_path.empty()) {
    std::ofstream(f.json_path) << out.dump(2) << "\n";
    std::printf("\ne2e_bench: wrote %s\n", f.json_path.c_str());
  }
  return 0;
}
