// Decode speed of the CPU forward pass on a real checkpoint (stories260K by
// default): single-stream greedy decode of 255 tokens from BOS, N runs, the
// median tokens/s; then batched decode of 8 and 64 sequences together (total
// tokens/s), on one thread and on the default thread count; then the model's
// linear layers alone (--mode gemm), each Linear kernel this CPU has (and the
// scalar loop for one row), for 1, 8, 64 and 169 rows. Wall-clock numbers are the headline;
// CPU-time numbers are printed beside them because they are steadier on a shared machine.
//
// --mode threads measures how the forward pass scales with threads on one
// sequence, as a user of `kvserve generate` sees it: a prompt of
// --prefill-tokens (default 169) tokens in one step, then greedy decode of
// --decode-tokens (default 64) tokens, for each count in --threads (default
// 1,2). The thread counts take turns within each run, so a noisy neighbour
// hits all of them alike; medians over --runs. It also checks that every
// thread count produced the same tokens. Meant for the model
// dummy:stories110m-shape (85.7M parameters; bench/README.md). With
// --weight-dtype fp32,int8,int4 every weight dtype runs at every thread
// count, in turns, and the table gives each against the first dtype.
//
// --mode quantize measures model.weight_dtype's cost at load: QuantizeWeights
// of the whole model for each --weight-dtype (default int8,int4,int4_asym)
// at each count in --threads, taking turns within each run as above, the
// median seconds and ns a weight over --runs; it checks that every thread
// count packed the same bytes.
//
// --write-llama2c FILE writes the model as a llama2.c checkpoint and exits,
// so other engines can run the very same weights (llama.cpp's
// llama-convert-llama2c-to-ggml reads it; bench/README.md). With
// --max-positions N the checkpoint's header (and its RoPE tables) say N
// positions instead of the model's own, and --num-layers N keeps only the
// first N layers: a dummy shape with a longer context and a cheaper forward
// pass (bench/tier_serve_bench.sh serves stories110m-shape's layers at
// 4,096 positions).
//
//   decode_bench [MODEL] [--runs N] [--json FILE]
//                [--mode all|single|batched|gemm|threads|quantize]
//                [--threads 1,2] [--prefill-tokens N] [--decode-tokens N]
//                [--write-llama2c FILE [--max-positions N] [--num-layers N]]
// MODEL defaults to $KVSERVE_SHARED/models/stories260k/stories260K.bin, else
// shared/models/stories260k beside the current directory or one of its
// ancestors (the repository root or a build folder inside it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/shared_file.h"
#include "cache/block_pool.h"
#include "cache/sizing/block_count.h"
#include "kernels/cpu/layers/gemm.h"
#include "kernels/cpu/quant/quant_matrix.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/loader/llama2c_loader.h"
#include "model/loader/model_loader.h"
#include "model/loader/quantize_weights.h"

namespace kvserve {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string DefaultModel() { return bench::SharedFile("models/stories260k/stories260K.bin"); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int32_t Argmax(const float* row, int n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// `num_seqs` sequences, each [BOS, first_token[i]] prefilled together, then
// `steps` decode steps of all of them together. Returns the seconds the
// decode steps took (prefill excluded when num_seqs > 1; for one sequence the
// prompt is BOS alone and every step, the first included, is timed).
struct DecodeResult {
  double seconds = 0;
  double cpu_seconds = 0;  // this thread's CPU time: less noisy on a shared machine
  int64_t tokens = 0;
  std::vector<int32_t> first_seq_tokens;
};

DecodeResult RunDecode(CpuModelRunner& runner, int num_seqs, int steps) {
  const ModelConfig& c = runner.config();
  const int bs = runner.kv_format().block_size();
  const int32_t max_blocks = BlocksForTokens(c.max_position_embeddings, bs);
  BlockPool pool(runner.num_blocks());
  std::vector<std::vector<int32_t>> tables(num_seqs);
  std::vector<int32_t> len(num_seqs, 0);  // tokens cached so far
  std::vector<float> logits(static_cast<size_t>(num_seqs) * c.vocab_size);
  DecodeResult res;

  BatchInput batch;
  batch.Clear();
  batch.max_blocks_per_seq = max_blocks;
  batch.block_table.assign(static_cast<size_t>(num_seqs) * max_blocks, -1);
  auto slot_for = [&](int s, int32_t i) -> int64_t {
    if (i / bs >= static_cast<int32_t>(tables[s].size())) {
      std::optional<BlockId> id = pool.Allocate();
      if (!id) {
        std::fprintf(stderr, "decode_bench: out of KV blocks\n");
        std::exit(1);
      }
      tables[s].push_back(*id);
      batch.block_table[static_cast<size_t>(s) * max_blocks + i / bs] = *id;
    }
    return int64_t{tables[s][i / bs]} * bs + i % bs;
  };

  std::vector<int32_t> next(num_seqs, c.bos_id);
  if (num_seqs > 1) {
    // Prefill [BOS, distinct token] per sequence so the streams differ.
    for (int s = 0; s < num_seqs; ++s) {
      const int32_t prompt[2] = {c.bos_id, static_cast<int32_t>(3 + (s * 37) % (c.vocab_size - 3))};
      for (int32_t i = 0; i < 2; ++i) {
        batch.token_ids.push_back(prompt[i]);
        batch.positions.push_back(i);
        batch.slot_mapping.push_back(slot_for(s, i));
      }
      batch.query_start.push_back(batch.num_tokens());
      batch.context_len.push_back(2);
      batch.logits_rows.push_back(batch.num_tokens() - 1);
      len[s] = 2;
    }
    if (!runner.Forward(batch, logits).ok()) std::exit(1);
    for (int s = 0; s < num_seqs; ++s)
      next[s] = Argmax(logits.data() + s * c.vocab_size, c.vocab_size);
  }
  // Decode: one row per sequence; the batch is updated in place.
  batch.token_ids.assign(num_seqs, 0);
  batch.positions.assign(num_seqs, 0);
  batch.slot_mapping.assign(num_seqs, 0);
  batch.query_start.resize(num_seqs + 1);
  batch.context_len.assign(num_seqs, 0);
  batch.logits_rows.resize(num_seqs);
  for (int s = 0; s <= num_seqs; ++s) batch.query_start[s] = s;
  for (int s = 0; s < num_seqs; ++s) batch.logits_rows[s] = s;

  const auto t0 = Clock::now();
  const double c0 = ThreadCpuSeconds();
  for (int step = 0; step < steps; ++step) {
    for (int s = 0; s < num_seqs; ++s) {
      const int32_t pos = len[s];
      batch.token_ids[s] = next[s];
      batch.positions[s] = pos;
      batch.slot_mapping[s] = slot_for(s, pos);
      batch.context_len[s] = pos + 1;
      len[s] = pos + 1;
    }
    if (absl::Status st = runner.Forward(batch, logits); !st.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    for (int s = 0; s < num_seqs; ++s)
      next[s] = Argmax(logits.data() + s * c.vocab_size, c.vocab_size);
    res.first_seq_tokens.push_back(next[0]);
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  res.cpu_seconds = ThreadCpuSeconds() - c0;
  res.tokens = int64_t{steps} * num_seqs;
  return res;
}

// One sequence: a prompt of `prompt_len` tokens in one step, then `steps`
// greedy decode steps (each caches the previous token and predicts the next).
// Times both phases.
struct PromptResult {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  std::vector<int32_t> tokens;  // the generated ones
};

PromptResult RunPromptThenDecode(CpuModelRunner& runner, int prompt_len, int steps) {
  const ModelConfig& c = runner.config();
  const int bs = runner.kv_format().block_size();
  const int32_t total = prompt_len + steps;  // the last decode step's token is not cached
  const int32_t blocks = BlocksForTokens(total, bs);
  std::vector<float> logits(c.vocab_size);
  BatchInput batch;
  batch.Clear();
  batch.max_blocks_per_seq = blocks;
  for (int32_t b = 0; b < blocks; ++b) batch.block_table.push_back(b);  // a fresh pool each time
  for (int32_t i = 0; i < prompt_len; ++i) {
    // BOS, then a fixed spread of ids (not text: the vocabulary may be a dummy one).
    batch.token_ids.push_back(i == 0 ? c.bos_id : 3 + (i * 7919) % (c.vocab_size - 3));
    batch.positions.push_back(i);
    batch.slot_mapping.push_back(i);
  }
  batch.query_start.push_back(prompt_len);
  batch.context_len.push_back(prompt_len);
  batch.logits_rows.push_back(prompt_len - 1);
  PromptResult res;
  auto forward = [&]() {
    if (absl::Status st = runner.Forward(batch, logits); !st.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    res.tokens.push_back(Argmax(logits.data(), c.vocab_size));
  };
  const auto t0 = Clock::now();
  forward();
  const auto t1 = Clock::now();
  for (int32_t i = prompt_len; i < total; ++i) {
    batch.token_ids.assign(1, res.tokens.back());
    batch.positions.assign(1, i);
    batch.slot_mapping.assign(1, i);
    batch.query_start = {0, 1};
    batch.context_len.assign(1, i + 1);
    batch.logits_rows.assign(1, 0);
    forward();
  }
  const auto t2 = Clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return res;
}

// --mode threads (see the top of the file): every weight dtype at every
// thread count, taking turns within each run.
nlohmann::json BenchThreads(const LlamaWeights& w, const std::vector<std::string>& weight_dtypes,
                            const std::vector<int>& thread_counts, int prompt_len,
                            int decode_tokens, int runs) {
  const ModelConfig& c = w.config;
  struct Config {
    std::string weight_dtype;
    std::unique_ptr<CpuModelRunner> runner;
    std::vector<double> prefill_tps, decode_tps;
    std::vector<int32_t> tokens;
  };
  std::vector<Config> per;
  const int steps = decode_tokens;
  for (const std::string& wd : weight_dtypes) {
    absl::StatusOr<WeightQuantSpec> spec = ParseWeightQuant(wd);
    if (!spec.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(spec.status().message()).c_str());
      std::exit(2);
    }
    LlamaWeights qw = w;
    // Quantized once, on the most threads measured.
    const int quantize_threads =
        thread_counts.empty() ? 1 : *std::max_element(thread_counts.begin(), thread_counts.end());
    if (absl::Status st = QuantizeWeights(*spec, &qw, quantize_threads); !st.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    for (int threads : thread_counts) {
      CpuRunnerOptions opt;
      opt.num_threads = threads;
      opt.num_blocks = BlocksForTokens(prompt_len + steps, opt.block_size);
      auto runner = CpuModelRunner::Create(qw, opt);
      if (!runner.ok()) {
        std::fprintf(stderr, "decode_bench: %s\n", std::string(runner.status().message()).c_str());
        std::exit(1);
      }
      Config cf;
      cf.weight_dtype = wd;
      cf.runner = std::move(*runner);
      cf.tokens = RunPromptThenDecode(*cf.runner, prompt_len, steps).tokens;  // warm-up
      per.push_back(std::move(cf));
    }
  }
  std::printf("%s: prompt of %d tokens in one step, then %d greedy decode steps; %d runs\n",
              c.name.c_str(), prompt_len, steps, runs);
  for (int r = 0; r < runs; ++r) {
    for (Config& p : per) {
      PromptResult pr = RunPromptThenDecode(*p.runner, prompt_len, steps);
      p.prefill_tps.push_back(prompt_len / pr.prefill_seconds);
      p.decode_tps.push_back(steps / pr.decode_seconds);
      std::printf("run %d, %s weights, %d thread(s): prefill %.0f tokens/s, decode %.1f tokens/s\n",
                  r + 1, p.weight_dtype.c_str(), p.runner->num_threads(), p.prefill_tps.back(),
                  p.decode_tps.back());
      if (pr.tokens != p.tokens) {
        std::fprintf(stderr,
                     "decode_bench: %s, %d thread(s) generated different tokens run to run\n",
                     p.weight_dtype.c_str(), p.runner->num_threads());
        std::exit(1);
      }
    }
  }
  nlohmann::json out = nlohmann::json::array();
  bool same = true;
  for (const Config& p : per) {
    // The same weights give the same tokens at every thread count.
    for (const Config& q : per)
      same = same && (q.weight_dtype != p.weight_dtype || q.tokens == p.tokens);
  }
  std::printf("\n%-8s %7s %14s %13s %9s %9s\n", "weights", "threads", "prefill tok/s",
              "decode tok/s", "prefill x", "decode x");
  for (const Config& p : per) {
    const double dec = Median(p.decode_tps), pre = Median(p.prefill_tps);
    // Against the first weight dtype (fp32 by default) at the same thread count.
    double base_dec = dec, base_pre = pre;
    for (const Config& q : per) {
      if (q.weight_dtype == per[0].weight_dtype &&
          q.runner->num_threads() == p.runner->num_threads()) {
        base_dec = Median(q.decode_tps);
        base_pre = Median(q.prefill_tps);
        break;
      }
    }
    std::printf("%-8s %7d %14.0f %13.1f %8.2fx %8.2fx\n", p.weight_dtype.c_str(),
                p.runner->num_threads(), pre, dec, pre / base_pre, dec / base_dec);
    out.push_back({{"weight_dtype", p.weight_dtype},
                   {"weight_bytes", p.runner->memory_info().weight_bytes},
                   {"threads", p.runner->num_threads()},
                   {"prefill_tokens", prompt_len},
                   {"decode_tokens", steps},
                   {"runs_prefill_tokens_per_s", p.prefill_tps},
                   {"runs_decode_tokens_per_s", p.decode_tps},
                   {"median_prefill_tokens_per_s", pre},
                   {"median_decode_tokens_per_s", dec},
                   {"prefill_vs_first_dtype", pre / base_pre},
                   {"decode_vs_first_dtype", dec / base_dec}});
  }
  std::printf("tokens identical across thread counts: %s\n", same ? "yes" : "NO");
  if (!same) std::exit(1);
  return out;
}

// Microseconds per row for every weight matrix of one token, per kernel.
nlohmann::json BenchLinear(const LlamaWeights& w, int runs) {
  struct Mat {
    std::vector<float> data;  // a copy, so every kernel reads the same memory
    int64_t out, in;
  };
  std::vector<Mat> mats;
  auto add = [&](const Tensor& t) {
    mats.push_back({std::vector<float>(t.data, t.data + t.numel()), t.shape[0], t.shape[1]});
  };
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(*t);
  }
  add(w.output);
  int64_t max_in = 0, max_out = 0, macs = 0;
  for (const Mat& m : mats) {
    max_in = std::max(max_in, m.in);
    max_out = std::max(max_out, m.out);
    macs += m.in * m.out;
  }
  nlohmann::json out = nlohmann::json::array();
  for (int rows : {1, 8, 64, 169}) {
    std::vector<float> x(rows * max_in, 0.25f), y(rows * max_out);
    // Each kernel this CPU has; the scalar loop (what the AVX kernels
    // replaced) for one row only.
    const std::pair<cpu::LinearKernel, const char*> kernels[] = {
        {cpu::LinearKernel::kBest, "kvserve"},
        {cpu::LinearKernel::kAvx512, "avx512"},
        {cpu::LinearKernel::kAvx2, "avx2"},
        {cpu::LinearKernel::kScalar, "scalar"}};
    for (const auto& [kernel, name] : kernels) {
      if (!cpu::LinearKernelAvailable(kernel)) continue;
      if (kernel == cpu::LinearKernel::kScalar && rows != 1) continue;
      const int iters = std::max(1, 400 / rows);
      std::vector<double> per_row_us;
      for (int r = 0; r < std::max(3, runs); ++r) {
        const double c0 = ThreadCpuSeconds();
        for (int it = 0; it < iters; ++it) {
          for (const Mat& m : mats) {
            cpu::Linear(x.data(), rows, m.in, m.data.data(), m.out, y.data(), m.out, false, kernel);
          }
        }
        per_row_us.push_back((ThreadCpuSeconds() - c0) / iters / rows * 1e6);
      }
      const double med = Median(per_row_us);
      std::printf("linear layers of one token, %3d rows, %-8s %9.2f us per row (%.1f GFLOP/s)\n",
                  rows, name, med, 2.0 * macs / (med * 1e3));
      std::fflush(stdout);
      out.push_back({{"rows", rows}, {"kernel", name}, {"cpu_us_per_row", med}});
    }
  }
  return out;
}

// FNV-1a over every packed byte of the quantized linears, in model order.
uint64_t PackedHash(const QuantizedLinears& q) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&h](const void* p, int64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (int64_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  auto matrix = [&](const cpu::QuantMatrix& m) {
    if (m.empty()) return;
    add(m.block(0), m.num_blocks() * m.block_stride());
    if (m.kind() == cpu::QuantKind::kInt8) {
      const int64_t n = m.num_blocks() * cpu::kQuantBlock;
      add(m.channel_scales(), n * int64_t{sizeof(float)});
      add(m.channel_sums(), n * int64_t{sizeof(int32_t)});
    }
  };
  for (const QuantizedLinears::Layer& l : q.layers) {
    for (const cpu::QuantMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      matrix(*m);
    }
  }
  matrix(q.output);
  return h;
}

// --mode quantize (see the top of the file).
nlohmann::json BenchQuantize(const LlamaWeights& w, const std::vector<std::string>& weight_dtypes,
                             const std::vector<int>& thread_counts, int runs) {
  struct Config {
    std::string weight_dtype;
    WeightQuantSpec spec;
    int threads = 1;
    int64_t weights = 0;
    std::vector<double> seconds, cpu_seconds;
    uint64_t hash = 0;
  };
  std::vector<Config> per;
  for (const std::string& wd : weight_dtypes) {
    absl::StatusOr<WeightQuantSpec> spec = ParseWeightQuant(wd);
    if (!spec.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(spec.status().message()).c_str());
      std::exit(2);
    }
    for (int threads : thread_counts) per.push_back({wd, *spec, std::max(1, threads)});
  }
  std::printf("%s: QuantizeWeights of the whole model; %d runs\n", w.config.name.c_str(), runs);
  for (int r = 0; r < runs; ++r) {
    for (Config& p : per) {
      LlamaWeights qw = w;
      const double cpu0 = ProcessCpuSeconds();
      if (absl::Status st = QuantizeWeights(p.spec, &qw, p.threads); !st.ok()) {
        std::fprintf(stderr, "decode_bench: %s\n", std::string(st.message()).c_str());
        std::exit(1);
      }
      const QuantizedLinears& q = *qw.quantized;
      p.weights = q.num_weights;
      p.seconds.push_back(q.seconds);
      p.cpu_seconds.push_back(ProcessCpuSeconds() - cpu0);
      std::printf("run %d, %s, %d thread(s): %.3f s, %.1f ns a weight (%.3f CPU-s)\n", r + 1,
                  p.weight_dtype.c_str(), p.threads, q.seconds,
                  q.seconds * 1e9 / static_cast<double>(q.num_weights), p.cpu_seconds.back());
      std::fflush(stdout);
      const uint64_t h = PackedHash(q);
      if (r == 0) p.hash = h;
      if (h != p.hash) {
        std::fprintf(stderr, "decode_bench: %s, %d thread(s) packed different bytes run to run\n",
                     p.weight_dtype.c_str(), p.threads);
        std::exit(1);
      }
    }
  }
  // CPU-s: the process's CPU seconds (all threads); on a shared machine the
  // wall-clock speedup is bounded by the cores the others leave.
  std::printf("\n%-10s %7s %12s %9s %10s %8s %9s %14s\n", "weights", "threads", "weights",
              "median s", "ns/weight", "speedup", "CPU-s", "CPU-ns/weight");
  nlohmann::json out = nlohmann::json::array();
  bool same = true;
  for (const Config& p : per) {
    const double med = Median(p.seconds);
    double base = med;  // the first thread count of the same dtype
    for (const Config& q : per) {
      if (q.weight_dtype != p.weight_dtype) continue;
      base = Median(q.seconds);
      same = same && q.hash == p.hash;
      break;
    }
    const double ns = med * 1e9 / static_cast<double>(p.weights), cpu = Median(p.cpu_seconds);
    std::printf("%-10s %7d %12lld %9.3f %10.1f %7.2fx %9.3f %14.1f\n", p.weight_dtype.c_str(),
                p.threads, static_cast<long long>(p.weights), med, ns, base / med, cpu,
                cpu * 1e9 / static_cast<double>(p.weights));
    out.push_back({{"weight_dtype", p.weight_dtype},
                   {"threads", p.threads},
                   {"weights", p.weights},
                   {"runs_seconds", p.seconds},
                   {"median_seconds", med},
                   {"median_ns_per_weight", ns},
                   {"runs_cpu_seconds", p.cpu_seconds},
                   {"median_cpu_seconds", cpu},
                   {"speedup_vs_first_thread_count", base / med}});
  }
  std::printf("packed bytes identical across thread counts: %s\n", same ? "yes" : "NO");
  if (!same) std::exit(1);
  return out;
}

int Main(int argc, char** argv) {
  std::string model_path;
  std::string json_path = "bench-decode.json";
  int runs = 7;
  std::string mode = "all";
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> weight_dtypes = {"fp32"};
  int prefill_tokens = 169, decode_tokens = 64;
  std::string llama2c_out;
  int max_positions = 0;  // 0: the model's own
  int num_layers = 0;     // 0: all of the model's
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--mode" && i + 1 < argc) {
      mode = argv[++i];
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--write-llama2c" && i + 1 < argc) {
      llama2c_out = argv[++i];
    } else if (a == "--max-positions" && i + 1 < argc) {
      max_positions = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--num-layers" && i + 1 < argc) {
      num_layers = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--prefill-tokens" && i + 1 < argc) {
      prefill_tokens = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--decode-tokens" && i + 1 < argc) {
      decode_tokens = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      thread_counts.clear();
      for (const char* p = argv[++i]; *p != '\0';) {
        thread_counts.push_back(std::atoi(p));
        while (*p != '\0' && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else if (a == "--weight-dtype" && i + 1 < argc) {
      weight_dtypes = absl::StrSplit(argv[++i], ',');
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: decode_bench [MODEL] [--runs N] [--json FILE] [--mode "
          "all|single|batched|gemm|threads|quantize]\n"
          "                    [--threads 1,2] [--prefill-tokens 169] [--decode-tokens 64]\n"
          "                    [--weight-dtype fp32,int8,int4,int4_asym] (--mode threads, "
          "quantize)\n"
          "                    [--write-llama2c FILE [--max-positions N] [--num-layers N]]\n");
      return 0;
    } else if (!a.empty() && a[0] != '-') {
      model_path = a;
    } else {
      std::fprintf(stderr, "decode_bench: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (model_path.empty()) model_path = DefaultModel();
  auto loaded = LoadModel(model_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  if (max_positions > 0) loaded->weights.config.max_position_embeddings = max_positions;
  if (num_layers > 0 && num_layers < loaded->weights.config.num_layers) {
    loaded->weights.config.num_layers = num_layers;
    loaded->weights.layers.resize(static_cast<size_t>(num_layers));
  }
  const ModelConfig& c = loaded->weights.config;
  if (!llama2c_out.empty()) {
    if (absl::Status st = WriteLlama2cCheckpoint(loaded->weights, llama2c_out, /*version=*/0);
        !st.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    std::printf("wrote %s\n", llama2c_out.c_str());
    return 0;
  }
  if (mode == "quantize") {
    if (weight_dtypes == std::vector<std::string>{"fp32"})
      weight_dtypes = {"int8", "int4", "int4_asym"};
    nlohmann::json out = {
        {"model", c.name},
        {"quantize", BenchQuantize(loaded->weights, weight_dtypes, thread_counts, runs)}};
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
    return 0;
  }
  if (mode == "threads") {
    if (prefill_tokens + decode_tokens > c.max_position_embeddings) {
      std::fprintf(stderr, "decode_bench: %d + %d tokens do not fit %d positions\n", prefill_tokens,
                   decode_tokens, c.max_position_embeddings);
      return 2;
    }
    nlohmann::json out = {{"model", c.name},
                          {"cpu_kernel", std::string(cpu::QuantKernelName(cpu::BestQuantKernel()))},
                          {"threads", BenchThreads(loaded->weights, weight_dtypes, thread_counts,
                                                   prefill_tokens, decode_tokens, runs)}};
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
    return 0;
  }
  const int steps = std::min(255, c.max_position_embeddings - 2);
  nlohmann::json out;
  out["model"] = c.name;
  out["steps"] = steps;

  // Single stream, one thread: the headline number.
  if (mode == "all" || mode == "single") {
    CpuRunnerOptions opt;
    opt.num_threads = 1;
    auto runner = CpuModelRunner::Create(loaded->weights, opt);
    if (!runner.ok()) return 1;
    RunDecode(**runner, 1, steps);  // warm-up: page in weights, size buffers
    std::vector<double> tps, cpu_tps;
    for (int r = 0; r < runs; ++r) {
      DecodeResult d = RunDecode(**runner, 1, steps);
      tps.push_back(d.tokens / d.seconds);
      cpu_tps.push_back(d.tokens / d.cpu_seconds);
      std::printf(
          "single-stream run %d: %lld tokens in %.3f ms = %.0f tokens/s (%.0f per CPU second)\n",
          r + 1, static_cast<long long>(d.tokens), d.seconds * 1e3, tps.back(), cpu_tps.back());
    }
    const double med = Median(tps);
    std::printf(
        "single-stream greedy decode: median %.0f tokens/s over %d runs "
        "(%.0f per CPU second)\n",
        med, runs, Median(cpu_tps));
    out["single_stream"] = {{"threads", 1},
                            {"runs_tokens_per_s", tps},
                            {"median_tokens_per_s", med},
                            {"median_tokens_per_cpu_s", Median(cpu_tps)}};
  }

  // Batched decode: total tokens/s, one thread and the default pool.
  nlohmann::json batched = nlohmann::json::array();
  for (int threads : {1, 0}) {
    if (mode != "all" && mode != "batched") break;
    CpuRunnerOptions opt;
    opt.num_threads = threads;
    opt.num_blocks = 64 * BlocksForTokens(c.max_position_embeddings, opt.block_size);
    auto runner = CpuModelRunner::Create(loaded->weights, opt);
    if (!runner.ok()) return 1;
    for (int seqs : {8, 64}) {
      const int bsteps = steps - 1;
      RunDecode(**runner, seqs, bsteps);
      std::vector<double> tps;
      for (int r = 0; r < std::max(3, runs / 2); ++r) {
        DecodeResult d = RunDecode(**runner, seqs, bsteps);
        tps.push_back(d.tokens / d.seconds);
      }
      const double med = Median(tps);
      std::printf("batched decode, %2d sequences, %d thread(s): median %.0f tokens/s total\n", seqs,
                  (*runner)->num_threads(), med);
      batched.push_back({{"sequences", seqs},
                         {"threads", (*runner)->num_threads()},
                         {"runs_tokens_per_s", tps},
                         {"median_tokens_per_s", med}});
    }
  }
  out["batched"] = batched;
  if (mode == "all" || mode == "gemm") out["linear"] = BenchLinear(loaded->weights, runs);
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) { return kvserve::Main(argc, argv); }
