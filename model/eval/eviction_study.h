// The KV eviction quality study behind `kvserve eval-kv --policy ...`.
//
// Long text (RunLongTextStudy): one stream of text, teacher-forced through
// the paged cache of a CPU runner under each policy (EvictingSequence, so the
// engine's own eviction code runs), with perplexity per window of positions.
// Beside the policies:
//   none       dense attention over the whole stream; positions run past the
//              model's max_position_embeddings (RoPE computed past its table),
//              which is what StreamingLLM shows breaking down;
//   recompute  the gold baseline StreamingLLM compares against: each token
//              predicted from its previous budget tokens (the input token
//              and the budget - 1 before it) recomputed from scratch at
//              positions 0 .. (the first budget tokens simply from the
//              stream's start). Quadratic; many windows per forward pass.
// Streaming also runs sink-less (0 sink tokens, budget recent), as its own
// run. Evicting runs hold at most `budget` entries: after the first budget
// tokens, one token per step, so every prediction sees exactly `budget`
// entries (StreamingLLM's setting).
//
// Budget sweep (RunBudgetSweep): many streams of the model's own context
// (max_position_embeddings tokens, each from BOS), every policy at each
// budget fraction, and dense attention as the reference; perplexity over
// all predictions of all streams, windows per position range.
//
// Report (EvictionStudyJson): {"runs": [{"policy", "kv_dtype", "budget",
// "stream_tokens", "ppl", "windows": [{"start", "end", "ppl"}], ...}]};
// windows count predictions of the tokens at positions [start, end).
//
// Thread-safety: none; the study drives the runners it makes from the
// calling thread (each runner uses its own thread pool).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/learned_evictor.h"
#include "cache/format/kv_dtype_spec.h"
#include "model/model_runner.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve {

// The stories of `text` ('<|endoftext|>' lines between them) joined with
// newlines into one token stream with a single BOS at its start, `tokens`
// long. NotFound when the text is shorter.
absl::StatusOr<std::vector<int32_t>> BuildTokenStream(std::string_view text,
                                                      const Tokenizer& tokenizer, int32_t tokens);

// Makes a runner with at least num_blocks blocks for one KV format.
using StudyRunnerFactory = std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(
    const KvDtypeSpec& dtype, int32_t num_blocks)>;

struct EvictionStudyOptions {
  // Policies to run (none: dense); recompute is added by `recompute`.
  std::vector<EvictionPolicyKind> policies;
  std::vector<KvDtypeSpec> dtypes;  // each policy runs with each
  int32_t budget = 256;
  int32_t sink_tokens = 4;
  int32_t recent_tokens = 0;     // 0: derived (EvictionParams)
  int32_t window = 256;          // perplexity window, positions
  bool recompute = true;         // the gold baseline, per dtype
  bool sinkless = true;          // streaming with 0 sinks too, when streaming runs
  int32_t dense_chunk = 256;     // rows per step of dense passes
  int32_t recompute_batch = 32;  // recompute windows per forward pass
  // Policy learned (required when it is asked).
  std::shared_ptr<const EvictorModel> learned;
  // Called after each unit of work with (done, total); may be empty.
  std::function<void(int64_t, int64_t)> progress;
};

struct StudyWindow {
  int32_t start = 0;
  int32_t end = 0;
  double ppl = 0;
};

struct StudyRun {
  std::string policy;  // a policy name, or "recompute"
  std::string label;   // e.g. "streaming (4 sinks)"
  std::string kv_dtype;
  int32_t budget = 0;        // 0 for none
  int32_t sink_tokens = -1;  // streaming only
  int32_t stream_tokens = 0;
  int32_t num_streams = 1;
  double ppl = 0;
  std::vector<StudyWindow> windows;
  int32_t max_blocks_held = 0;  // evicting runs
};

// How much attention the stream's first token draws (long text): per layer,
// its share of all the attention the first `rows` rows pay, dense, against
// the share it would get were every row's attention uniform over what it
// sees. A model with attention sinks gives the first token many times its
// uniform share; StreamingLLM's sinks matter exactly then.
struct FirstTokenAttention {
  int32_t rows = 0;
  double uniform_share = 0;
  std::vector<double> share;  // [num_layers]
};

struct EvictionStudyReport {
  std::string model;
  std::string text;
  std::string kind;  // "long_text" or "sweep"
  int32_t block_size = 0;
  int32_t max_position_embeddings = 0;
  double seconds = 0;
  std::vector<StudyRun> runs;
  FirstTokenAttention first_token;  // long text only

  const StudyRun* Find(std::string_view label, std::string_view kv_dtype) const;
};

// The long-text study over `stream` (BOS first).
absl::StatusOr<EvictionStudyReport> RunLongTextStudy(std::span<const int32_t> stream,
                                                     const StudyRunnerFactory& make_runner,
                                                     const EvictionStudyOptions& options);

struct BudgetSweepOptions {
  std::vector<EvictionPolicyKind> policies;  // evicting ones; none is the reference
  std::vector<double> fractions = {0.1, 0.2, 0.3, 0.5, 0.7};
  KvDtypeSpec dtype = KvDtype::kFp32;
  int32_t window = 128;
  int32_t sink_tokens = 4;
  std::shared_ptr<const EvictorModel> learned;
  std::function<void(int64_t, int64_t)> progress;
};

// The sweep over `streams` (each BOS first, all the same length).
absl::StatusOr<EvictionStudyReport> RunBudgetSweep(const std::vector<std::vector<int32_t>>& streams,
                                                   const StudyRunnerFactory& make_runner,
                                                   const BudgetSweepOptions& options);

std::string EvictionStudyJson(const EvictionStudyReport& report);
// Long text: one row per run (overall and selected windows, the worst
// window against recompute); sweep: perplexity per policy and budget with
// the change against none.
std::string EvictionStudyTable(const EvictionStudyReport& report);
// The gnuplot script (and its inline data) plotting perplexity against
// position, one line per run of `kv_dtype` (long text), or perplexity
// against budget, one line per policy (sweep), into png_path.
std::string EvictionStudyGnuplot(const EvictionStudyReport& report, const std::string& kv_dtype,
                                 const std::string& png_path);

}  // namespace kvserve
