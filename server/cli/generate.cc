// `kvserve generate`: offline generation for one prompt, through the same
// Engine the daemon serves with (as vLLM's offline LLM class goes through
// its engine): the prompt is prefilled as one chunk, then one token is
// decoded per step, with the scheduler's stop rules (EOS, BOS for llama2.c
// stories, max_tokens, the end of the context). Text streams to stdout in
// whole UTF-8 characters (the prompt is not echoed); speed goes to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "model/cpu/cpu_threads.h"
#include "model/loader/model_loader.h"
#include "model/runner_factory.h"
#include "model/sampling/sampling_params.h"
#include "scheduler/engine.h"
#include "server/cli/commands.h"
#include "server/cli/flags.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve generate --model PATH [options]\n"
    "Generates text for one prompt and streams it to stdout (the prompt is not\n"
    "echoed); prints tokens/s to stderr. Stops at EOS, at --max-tokens, at the end of the\n"
    "model's context, and at BOS for llama2.c checkpoints.\n"
    "options:\n"
    "  --model PATH         llama2.c checkpoint, HF directory or dummy:<preset> (required)\n"
    "  --tokenizer FILE     tokenizer.json or SentencePiece .model (default: beside the model)\n"
    "  --prompt TEXT        prompt text (default: empty, i.e. BOS only)\n"
    "  --max-tokens N       tokens to generate, >= 1 (default 256)\n"
    "  --temperature T      0 is greedy (default: generation_config.json's, else 1)\n"
    "  --top-p P            nucleus mass in (0, 1] (default: generation_config.json's, else 1)\n"
    "  --top-k K            keep the K most likely tokens, 0 is off (default:\n"
    "                       generation_config.json's, else 0)\n"
    "  --min-p P            in [0, 1) (default 0)\n"
    "  --repetition-penalty R   > 0, 1 is off (default 1)\n"
    "  --seed S             random seed (default: a fresh one)\n"
    "  --block-size B       KV cache block size in tokens (default 16)\n"
    "  --kv-dtype D         KV cache dtype: fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4,\n"
    "                       int4_kc, int2_kc, or one per layer (int8,int4_kc*,int8)\n"
    "                       (default fp32)\n"
    "  --num-blocks N       KV blocks (default: enough for the model's whole context)\n"
    "  --threads N          CPU threads, 0 = what the cgroup and affinity allow (default 0)\n"
    "  --device D           cpu, cuda or cuda:N (default cpu)\n"
    "  --dtype D            weights and activations: auto, fp32, fp16, bf16 (default auto:\n"
    "                       fp32 on cpu, bf16 on cuda)\n"
    "  --weight-dtype D     linear layers (model.weight_dtype): auto, fp32, int8, int4,\n"
    "                       int4_asym, quantized at load, CPU only; 'int8+head int8' sets\n"
    "                       the head, 'int4/g128' the int4 group (default 32)\n"
    "                       (default auto: as --dtype)\n";

struct Options {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  int32_t max_tokens = 256;
  SamplingParams sampling;
  // Which of the parameters a checkpoint may recommend the flags set; the
  // others come from its generation_config.json, as in the daemon.
  bool set_temperature = false, set_top_p = false, set_top_k = false;
  int block_size = 16;
  KvDtypeSpec kv_dtype = KvDtype::kFp32;
  int32_t num_blocks = 0;
  int threads = 0;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string weight_dtype = "auto", weight_dtype_head = "auto";
  int32_t weight_group_size = 32;
};

// Parses argv (after the subcommand name) into *o. Returns -1 to go on, or
// the exit code (0 after --help, 2 on a bad flag).
int ParseFlags(int argc, char** argv, Options* o) {
  CliFlags flags("generate", kUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  ModelFlags m;
  for (const CliFlag& flag : flags.flags()) {
    if (std::optional<int> rc = m.Take(flags, flag,
                                       kModelFlag | kTokenizerFlag | kKvDtypeFlag | kBlockSizeFlag |
                                           kThreadsFlag | kWeightDtypeFlag)) {
      if (*rc >= 0) return *rc;
      continue;
    }
    const std::string& name = flag.name;
    const std::string& value = flag.value;
    auto bad = [&](const std::string& want) { return flags.BadValue(flag, want); };
    int64_t n = 0;
    float f = 0;
    if (name == "--prompt") {
      o->prompt = value;
    } else if (name == "--max-tokens") {
      if (!absl::SimpleAtoi(value, &n) || n < 1 || n > (1 << 30)) return bad("an integer >= 1");
      o->max_tokens = static_cast<int32_t>(n);
    } else if (name == "--temperature") {
      if (!absl::SimpleAtof(value, &f)) return bad("a number");
      o->sampling.temperature = f;
      o->set_temperature = true;
    } else if (name == "--top-p") {
      if (!absl::SimpleAtof(value, &f)) return bad("a number");
      o->sampling.top_p = f;
      o->set_top_p = true;
    } else if (name == "--top-k") {
      if (!absl::SimpleAtoi(value, &n) || n < -1 || n > (1 << 30)) return bad("an integer >= -1");
      o->sampling.top_k = static_cast<int32_t>(n);
      o->set_top_k = true;
    } else if (name == "--min-p") {
      if (!absl::SimpleAtof(value, &f)) return bad("a number");
      o->sampling.min_p = f;
    } else if (name == "--repetition-penalty") {
      if (!absl::SimpleAtof(value, &f)) return bad("a number");
      o->sampling.repetition_penalty = f;
    } else if (name == "--seed") {
      uint64_t seed = 0;
      if (!absl::SimpleAtoi(value, &seed)) return bad("a non-negative integer");
      o->sampling.seed = seed;
    } else if (name == "--num-blocks") {
      if (!absl::SimpleAtoi(value, &n) || n < 1 || n > (1 << 30)) return bad("an integer >= 1");
      o->num_blocks = static_cast<int32_t>(n);
    } else if (name == "--device") {
      if (absl::StatusOr<DeviceSpec> d = ParseDevice(value); !d.ok()) {
        return bad("cpu, cuda or cuda:N");
      }
      o->device = value;
    } else if (name == "--dtype") {
      if (!ResolveWeightDtype(value, DeviceSpec{}).ok()) return bad("auto, fp32, fp16 or bf16");
      o->dtype = value;
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", name, "'"));
    }
  }
  o->model = m.model;
  o->tokenizer = m.tokenizer;
  if (!m.kv_dtypes.empty()) o->kv_dtype = m.kv_dtypes.back();
  if (!m.weight_dtypes.empty()) {
    SetWeightDtype(m.weight_dtypes.back(), &o->weight_dtype, &o->weight_dtype_head,
                   &o->weight_group_size);
  }
  o->block_size = m.block_size.value_or(o->block_size);
  o->threads = m.threads.value_or(o->threads);
  if (o->model.empty()) return flags.UsageError("--model is required");
  if (absl::Status s = o->sampling.Validate(); !s.ok()) {
    return flags.UsageError(std::string(s.message()));
  }
  return -1;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvserve generate: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  Options opt;
  if (int rc = ParseFlags(argc, argv, &opt); rc >= 0) return rc;

  RunnerOptions ro;
  ro.device = opt.device;
  ro.dtype = opt.dtype;
  ro.weight_dtype = opt.weight_dtype;
  ro.weight_dtype_head = opt.weight_dtype_head;
  ro.weight_group_size = opt.weight_group_size;
  ro.kv_dtype = opt.kv_dtype;
  ro.block_size = opt.block_size;
  ro.num_threads = opt.threads > 0 ? opt.threads : DefaultCpuThreads();
  ro.max_num_seqs = 1;
  if (absl::Status device = CheckRunnerDevice(ro); !device.ok()) return Fail(device);
  absl::StatusOr<LoadedModel> loaded =
      LoadModel(opt.model, opt.tokenizer, RunnerDefersDummyWeights(ro));
  if (!loaded.ok()) return Fail(loaded.status());
  std::shared_ptr<const Tokenizer> tok(std::move(loaded->tokenizer));
  const ModelConfig config = loaded->weights.config;
  // What the flags leave unset is the checkpoint's recommendation (its
  // generation_config.json), as for a daemon request that sets none.
  const SamplingParams defaults = config.DefaultSampling();
  if (!opt.set_temperature) opt.sampling.temperature = defaults.temperature;
  if (!opt.set_top_p) opt.sampling.top_p = defaults.top_p;
  if (!opt.set_top_k) opt.sampling.top_k = defaults.top_k;
  if (absl::Status s = opt.sampling.Validate(); !s.ok()) return Fail(s);
  // Prompt + generated tokens stay within the context (vLLM's max_model_len).
  const int32_t max_len = config.max_position_embeddings;
  const int32_t prompt_len = static_cast<int32_t>(tok->Encode(opt.prompt, true).size());
  if (prompt_len >= max_len) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", prompt_len, " tokens; the model's context is ", max_len)));
  }

  // The whole context of one sequence unless --num-blocks says otherwise.
  ro.num_blocks = opt.num_blocks > 0 ? opt.num_blocks : BlocksForTokens(max_len, opt.block_size);
  ro.max_model_len = max_len;
  ro.max_num_batched_tokens = max_len;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(std::move(loaded->weights), ro);
  if (!runner.ok()) return Fail(runner.status());
  if (const RunnerMemoryInfo& m = (*runner)->memory_info(); m.quantized_weights > 0) {
    std::fprintf(stderr,
                 "kvserve generate: weights quantized to %s in %.2f s on %d thread(s) (%lld "
                 "weights, %.1f ns a weight)\n",
                 m.weight_dtype.c_str(), m.quantize_seconds, m.quantize_threads,
                 static_cast<long long>(m.quantized_weights),
                 m.quantize_seconds * 1e9 / static_cast<double>(m.quantized_weights));
  }

  // One sequence, its prompt in one chunk, nothing shared with anyone.
  EngineConfig ec;
  ec.max_num_seqs = 1;
  ec.max_model_len = max_len;
  ec.max_num_batched_tokens = max_len;
  ec.prefix_caching = false;
  // The engine's own timestamps of the first and later tokens: this thread
  // reads the stream late whenever the OS schedules it late, and would then
  // count tokens decoded long before as if they came at once.
  std::mutex metrics_mu;
  std::optional<RequestMetrics> metrics;
  ec.on_request_finished = [&](const RequestMetrics& m) {
    std::lock_guard<std::mutex> lock(metrics_mu);
    metrics = m;
  };
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(ec, *std::move(runner), tok);
  if (!engine.ok()) return Fail(engine.status());

  GenerateRequest req;
  req.prompt = opt.prompt;
  req.sampling = opt.sampling;
  req.max_tokens = std::min(opt.max_tokens, max_len - prompt_len);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = (*engine)->Submit(std::move(req));
  if (!stream.ok()) return Fail(stream.status());

  Clock::time_point t_first = t0;
  int32_t generated = 0;
  GenerateOutput out;
  while ((*stream)->Next(&out) == RequestStream::Pop::kOutput) {
    if (generated == 0 && !out.token_ids.empty()) t_first = Clock::now();
    generated += static_cast<int32_t>(out.token_ids.size());
    if (!out.text.empty()) {
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
    }
    if (out.finish_reason == FinishReason::kError) {
      return Fail(absl::InternalError(out.error));
    }
  }  // until the stream closes, after the engine reported the request's metrics
  std::fputc('\n', stdout);
  std::fflush(stdout);

  const auto t_end = Clock::now();
  double prefill_s = std::chrono::duration<double>(t_first - t0).count();
  const double total_s = std::chrono::duration<double>(t_end - t0).count();
  double decode_s = total_s - prefill_s;
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    if (metrics.has_value() && metrics->ttft_s > 0) {
      prefill_s = metrics->ttft_s;
      decode_s = metrics->tpot_s * (generated - 1);
    }
  }
  std::fprintf(stderr,
               "kvserve generate: %d tokens in %.1f ms, %.0f tokens/s (prompt: %d tokens in "
               "%.1f ms; decode: %.0f tokens/s)\n",
               generated, total_s * 1e3, total_s > 0 ? generated / total_s : 0.0, prompt_len,
               prefill_s * 1e3, (generated > 1 && decode_s > 0) ? (generated - 1) / decode_s : 0.0);
  return 0;
}

}  // namespace kvserve::cli
