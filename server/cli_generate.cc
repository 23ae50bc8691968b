// `kvserve generate`: offline generation for one prompt on the CPU backend.
// The prompt (BOS + its tokens) is prefilled as one chunk, then one token is
// decoded per step; blocks are taken from a BlockPool as the sequence grows,
// exactly as the engine does, so this is also the smallest end-to-end check
// of the paged cache. Text streams to stdout in whole UTF-8 characters (the
// prompt is not echoed); speed goes to stderr.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "cache/kv_format.h"
#include "model/cpu_model_runner.h"
#include "model/model_loader.h"
#include "model/sampler.h"
#include "model/sampling_params.h"
#include "scheduler/detokenizer.h"
#include "server/cli.h"
#include "server/cli_flags.h"

namespace kvserve::cli {
namespace {

constexpr char kUsage[] =
    "usage: kvserve generate --model PATH [options]\n"
    "Generates text for one prompt on the CPU and streams it to stdout (the prompt is not\n"
    "echoed); prints tokens/s to stderr. Stops at EOS, at --max-tokens, at the end of the\n"
    "model's context, and at BOS for llama2.c checkpoints.\n"
    "options:\n"
    "  --model PATH         llama2.c checkpoint, HF directory or dummy:<preset> (required)\n"
    "  --tokenizer FILE     SentencePiece .model (default: beside the model)\n"
    "  --prompt TEXT        prompt text (default: empty, i.e. BOS only)\n"
    "  --max-tokens N       tokens to generate, >= 1 (default 256)\n"
    "  --temperature T      0 is greedy (default 1)\n"
    "  --top-p P            nucleus mass in (0, 1] (default 1)\n"
    "  --top-k K            keep the K most likely tokens, 0 is off (default 0)\n"
    "  --min-p P            in [0, 1) (default 0)\n"
    "  --repetition-penalty R   > 0, 1 is off (default 1)\n"
    "  --seed S             random seed (default: a fresh one)\n"
    "  --block-size B       KV cache block size in tokens (default 16)\n"
    "  --kv-dtype D         KV cache dtype: fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4\n"
    "                       (default fp32)\n"
    "  --num-blocks N       KV blocks (default: enough for the model's whole context)\n"
    "  --threads N          CPU threads, 0 = all (default 0)\n";

struct Options {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  int32_t max_tokens = 256;
  SamplingParams sampling;
  int block_size = 16;
  KvDtype kv_dtype = KvDtype::kFp32;
  int32_t num_blocks = 0;
  int threads = 0;
};

// Parses argv (after the subcommand name) into *o. Returns -1 to go on, or
// the exit code (0 after --help, 2 on a bad flag).
int ParseFlags(int argc, char** argv, Options* o) {
  CliFlags flags("generate", kUsage);
  if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
  for (const CliFlag& flag : flags.flags()) {
    const std::string& name = flag.name;
    const std::string& value = flag.value;
    auto bad = [&](const std::string& want) { return flags.BadValue(flag, want); };
    int64_t n = 0;
    float f = 0;
    if (name == "--model") {
      o->model = value;
    } else if (name == "--tokenizer") {
      o->tokenizer = value;
    } else if (name == "--prompt") {
      o->prompt = value;
    } else if (name == "--max-tokens") {
      if (!absl::SimpleAtoi(value, &n) || n < 1 || n > (1 << 30)) return bad("an integer >= 1");
      o->max_tokens = static_cast<int32_t>(n);
    } else if (name == "--temperature") {
      if (!absl::SimpleAtof(value, &f)) return bad("a number");
      o->sampling.temperature = f;
    } else if (name == "--top-p") {
      if (!absl::SimpleAtof(value, &f)) return bad("a number");
      o->sampling.top_p = f;
    } else if (name == "--top-k") {
      if (!absl::SimpleAtoi(value, &n) || n < -1 || n > (1 << 30)) return bad("an integer >= -1");
      o->sampling.top_k = static_cast<int32_t>(n);
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
    } else if (name == "--block-size") {
      if (!absl::SimpleAtoi(value, &n) || n < 1 || n > 65536)
        return bad("an integer in [1, 65536]");
      o->block_size = static_cast<int>(n);
    } else if (name == "--kv-dtype") {
      absl::StatusOr<KvDtype> d = ParseKvDtype(value);
      if (!d.ok()) return flags.UsageError(std::string(d.status().message()));
      o->kv_dtype = *d;
    } else if (name == "--num-blocks") {
      if (!absl::SimpleAtoi(value, &n) || n < 1 || n > (1 << 30)) return bad("an integer >= 1");
      o->num_blocks = static_cast<int32_t>(n);
    } else if (name == "--threads") {
      if (!absl::SimpleAtoi(value, &n) || n < 0 || n > 1024) return bad("an integer >= 0");
      o->threads = static_cast<int>(n);
    } else {
      return flags.UsageError(absl::StrCat("unknown flag '", name, "'"));
    }
  }
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

// Appends the rows of tokens[begin, end) of the only sequence to a fresh
// batch, taking blocks from the pool as the sequence grows.
absl::Status BuildStep(const std::vector<int32_t>& tokens, int32_t begin, int32_t end,
                       BlockPool& pool, BlockTable& table, BatchInput& batch) {
  while (table.num_blocks() < table.BlocksFor(end)) {
    std::optional<BlockId> id = pool.Allocate();
    if (!id) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of KV blocks at ", end, " tokens (", pool.num_blocks(), " blocks of ",
                       table.block_size(), " tokens); raise --num-blocks"));
    }
    table.AppendBlock(*id);
    batch.block_table[table.num_blocks() - 1] = *id;
  }
  batch.token_ids.clear();
  batch.positions.clear();
  batch.slot_mapping.clear();
  for (int32_t i = begin; i < end; ++i) {
    batch.token_ids.push_back(tokens[i]);
    batch.positions.push_back(i);
    batch.slot_mapping.push_back(table.SlotOf(i));
  }
  batch.query_start.assign({0, end - begin});
  batch.context_len.assign({end});
  batch.logits_rows.assign({end - begin - 1});
  table.set_num_tokens(end);
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  Options opt;
  if (int rc = ParseFlags(argc, argv, &opt); rc >= 0) return rc;

  absl::StatusOr<LoadedModel> loaded = LoadModel(opt.model, opt.tokenizer);
  if (!loaded.ok()) return Fail(loaded.status());
  const Tokenizer& tok = *loaded->tokenizer;
  const ModelConfig config = loaded->weights.config;

  CpuRunnerOptions ro;
  ro.kv_dtype = opt.kv_dtype;
  ro.block_size = opt.block_size;
  ro.num_blocks = opt.num_blocks;  // 0: the whole context of one sequence
  ro.num_threads = opt.threads;
  absl::StatusOr<std::unique_ptr<CpuModelRunner>> runner_or =
      CpuModelRunner::Create(std::move(loaded->weights), ro);
  if (!runner_or.ok()) return Fail(runner_or.status());
  CpuModelRunner& runner = **runner_or;

  std::vector<int32_t> tokens = tok.Encode(opt.prompt, /*add_bos=*/true);
  const int32_t prompt_len = static_cast<int32_t>(tokens.size());
  // Prompt + generated tokens stay within the context (vLLM's max_model_len).
  const int32_t max_len = config.max_position_embeddings;
  tokens.reserve(max_len);
  if (prompt_len >= max_len) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", prompt_len, " tokens; the model's context is ", max_len)));
  }

  BlockPool pool(runner.num_blocks());
  BlockTable table(opt.block_size);
  BatchInput batch;
  batch.Clear();
  batch.max_blocks_per_seq = (max_len + opt.block_size - 1) / opt.block_size;
  batch.block_table.assign(batch.max_blocks_per_seq, kNoBlock);
  std::vector<float> logits(config.vocab_size);
  Sampler sampler;
  SamplerState state = SamplerState::ForRequest(opt.sampling);
  Detokenizer detok(&tok, tokens.back());
  std::string text;

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Clock::time_point t_first;
  int32_t generated = 0;
  int32_t cached = 0;
  for (;;) {
    const int32_t len = static_cast<int32_t>(tokens.size());
    if (absl::Status s = BuildStep(tokens, cached, len, pool, table, batch); !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s = runner.Forward(batch, logits); !s.ok()) return Fail(s);
    cached = len;
    const std::span<const int32_t> all(tokens);
    const int32_t next = sampler.Sample(logits, opt.sampling, all.first(prompt_len),
                                        all.subspan(prompt_len), &state);
    if (generated == 0) t_first = Clock::now();
    if (next == config.eos_id || (config.bos_is_stop && next == config.bos_id)) break;
    tokens.push_back(next);
    ++generated;
    text.clear();
    detok.Add(next, &text);
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    if (generated >= opt.max_tokens || len + 1 >= max_len) break;
  }
  text.clear();
  detok.Finish(&text);
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);

  const auto t_end = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
  const double total_s = std::chrono::duration<double>(t_end - t0).count();
  const double decode_s = total_s - prefill_s;
  std::fprintf(stderr,
               "kvserve generate: %d tokens in %.1f ms, %.0f tokens/s (prompt: %d tokens in "
               "%.1f ms; decode: %.0f tokens/s)\n",
               generated, total_s * 1e3, total_s > 0 ? generated / total_s : 0.0, prompt_len,
               prefill_s * 1e3, (generated > 1 && decode_s > 0) ? (generated - 1) / decode_s : 0.0);
  return 0;
}

}  // namespace kvserve::cli
