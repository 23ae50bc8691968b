// KV format evaluation harness, the library behind `kvserve eval-kv`: how
// much a quantized KV format changes what the model predicts, measured on
// real text against the fp32 cache.
//
// Every number comes from the real paged path: each story is fed through a
// ModelRunner (teacher forcing, in prefill chunks, one sequence at a time,
// blocks taken from a BlockPool as the story grows), so its K/V are written
// in the runner's format and read back by the attention kernel, including
// across chunk boundaries.
//
// Per format:
//   * perplexity: exp(mean negative log-likelihood) over every next-token
//     prediction of every story;
//   * mean KL(p_fp32 || p_format) of the next-token distribution, and top-1
//     agreement with fp32, at the same positions;
//   * mean greedy-agreement length: from the first `prompt_tokens` tokens of
//     `num_prompts` stories, greedy continuations of up to `continuation`
//     tokens with fp32 and with the format; the count of equal tokens before
//     the first difference (a stop token counts as a token and ends a
//     continuation, as in `kvserve generate`);
//   * KV bytes per token over all layers, scales included, and the ratio to
//     fp16.
// The fp32 reference runs once: the work is story-major, so the reference
// logits of one story (floats, with their log-normalizers) are kept while
// every other format runs that story, and memory stays bounded by one
// story's [tokens][vocab] whatever the text's length.
//
// Thread-safety: none; EvaluateKvQuality drives the runners it creates from
// the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/format/kv_cross_layer.h"
#include "cache/format/kv_dtype_spec.h"
#include "cache/format/kv_format.h"
#include "model/model_runner.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {

// Splits text at lines that hold only `<|endoftext|>`, strips each story's
// surrounding whitespace and drops empty ones (the dev text's format).
std::vector<std::string> SplitStories(std::string_view text);

// SplitStories, then encodes each story as BOS + text,
// truncated to max_tokens. Keeps at most max_stories (0: all).
std::vector<std::vector<int32_t>> TokenizeStories(std::string_view text, const Tokenizer& tokenizer,
                                                  int32_t max_tokens, int32_t max_stories = 0);

// Makes the runner for one KV format (one dtype, or one per layer); called
// once per format, fp32 first. Each runner must hold at least one sequence of
// the longest story (and, for int4_kc, have a tail block).
using KvRunnerFactory =
    std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const KvDtypeSpec&)>;

struct KvQualityOptions {
  // Formats to report (a dtype converts to a spec); fp32 (the reference) is
  // always evaluated and always the first row, and duplicates are dropped.
  std::vector<KvDtypeSpec> dtypes;
  // The int4 group size the factory's runners use (for bytes per token).
  int int4_group_size = 64;
  // Rows per prefill step of the teacher-forced pass (>= 1).
  int32_t chunk_tokens = 64;
  // Greedy agreement: prompts (the first stories long enough), their length
  // in tokens (BOS included), and the most tokens to generate per prompt.
  int32_t num_prompts = 16;
  int32_t prompt_tokens = 16;
  int32_t continuation = 128;
  // Called after each unit of work with (done, total); may be empty.
  std::function<void(int64_t, int64_t)> progress;
  // Weight dtypes instead (kvserve eval-kv --weight-dtype): when set, the
  // rows are "fp32" (the reference) then these names, each a runner from
  // make_weight_runner with an fp32 KV cache; `dtypes` is ignored.
  std::vector<std::string> weight_dtypes;
  std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const std::string&)>
      make_weight_runner;
  // Low-rank KV rows (eval-kv --low-rank FILE): after the formats, for each
  // file one row per format of `dtypes` (fp32 alone when it is empty), each
  // a runner from make_low_rank_runner(format, file).
  std::vector<std::string> low_rank;
  std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const KvDtypeSpec&,
                                                             const std::string&)>
      make_low_rank_runner;
  // Cross-layer KV rows (eval-kv --cross-layer L[:T[:R]]): after the
  // low-rank rows, for each setting one row per format of `dtypes` (fp32
  // alone when it is empty), each a runner from
  // make_cross_layer_runner(format, setting).
  std::vector<KvCrossLayerSpec> cross_layer;
  std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const KvDtypeSpec&,
                                                             const KvCrossLayerSpec&)>
      make_cross_layer_runner;
};

struct KvFormatQuality {
  KvDtypeSpec dtype = KvDtype::kFp32;  // one dtype or one per layer
  std::string weight_dtype = "fp32";   // the runner's model.weight_dtype
  std::string low_rank;                // the low-rank file of the row; "": none
  KvCrossLayerSpec cross_layer;        // the row's cache.cross_layer; off by default
  int64_t bytes_per_token = 0;         // all layers, as allocated (kv_layers.h)
  double bytes_vs_fp16 = 0;            // bytes_per_token / fp16's
  double perplexity = 0;
  double delta_ppl_percent = 0;      // against fp32
  double mean_kl = 0;                // nats per prediction
  double max_kl = 0;                 // the worst single prediction
  double top1_agreement = 0;         // fraction of predictions with fp32's argmax
  double mean_greedy_agreement = 0;  // tokens
  double greedy_full_match = 0;      // fraction of prompts continued exactly as fp32
};

struct KvQualityReport {
  // Filled by the caller, for the JSON (e.g. the model and text paths).
  std::string model;
  std::string text;
  int32_t num_stories = 0;
  int64_t num_predictions = 0;
  int32_t num_prompts = 0;  // prompts actually used (stories long enough)
  int32_t prompt_tokens = 0;
  int32_t continuation = 0;
  int32_t block_size = 0;
  int32_t int4_group_size = 0;           // as an int4 format stored it (clamped); 0: none ran
  double seconds = 0;                    // wall time of the evaluation
  std::vector<KvFormatQuality> formats;  // fp32 first, then options.dtypes' order

  const KvFormatQuality* Find(const KvDtypeSpec& dtype) const;
};

// Runs the evaluation over `stories` (each BOS + tokens, at least 2 tokens
// to count). InvalidArgument for bad options or no usable story; a runner's
// error is returned as is.
absl::StatusOr<KvQualityReport> EvaluateKvQuality(const std::vector<std::vector<int32_t>>& stories,
                                                  const KvRunnerFactory& make_runner,
                                                  const KvQualityOptions& options);

// Greedy decoding of one sequence on `runner` (blocks from a fresh BlockPool
// over all its blocks): prefills `prompt` in one step, then decodes up to
// max_new_tokens. With stop_at_stop_tokens, a stop token
// (ModelConfig::IsStopToken) is returned as the last token and ends decoding. Also
// stops at the end of the model's context. Returns the generated tokens.
absl::StatusOr<std::vector<int32_t>> GreedyDecode(ModelRunner& runner,
                                                  std::span<const int32_t> prompt,
                                                  int32_t max_new_tokens, bool stop_at_stop_tokens);

// The report as an aligned text table (one row per format) and as JSON.
std::string KvQualityTable(const KvQualityReport& report);
std::string KvQualityJson(const KvQualityReport& report);

}  // namespace kvserve
