#include "model/eval/kv_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "kernels/batch_input.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace kvserve {
namespace {

constexpr std::string_view kStorySeparator = "<|endoftext|>";

// One sequence on one runner: its blocks come from a pool over all of the
// runner's blocks and go back on Reset, so consecutive stories reuse (stale)
// blocks exactly as an engine does.
class OneSequence {
 public:
  explicit OneSequence(ModelRunner& runner)
      : runner_(runner),
        pool_(runner.num_blocks()),
        table_(runner.kv_format().block_size()),
        vocab_(runner.config().vocab_size) {
    const int32_t bs = runner.kv_format().block_size();
    batch_.Clear();
    batch_.max_blocks_per_seq = BlocksForTokens(runner.config().max_position_embeddings, bs);
    batch_.block_table.assign(batch_.max_blocks_per_seq, kNoBlock);
    // int4_kc: the one sequence keeps its partial block in tail 0.
    if (runner.num_tail_blocks() > 0) batch_.tail_ids.assign(1, 0);
  }
  ~OneSequence() { Reset(); }
  OneSequence(const OneSequence&) = delete;
  OneSequence& operator=(const OneSequence&) = delete;

  void Reset() {
    for (BlockId id : table_.blocks()) pool_.Release(id);
    table_.Clear();
    std::fill(batch_.block_table.begin(), batch_.block_table.end(), kNoBlock);
  }

  // Runs rows tokens[begin, end) with tokens[0, begin) already cached. Fills
  // logits with every row's logits ([end - begin][vocab]) when all_rows,
  // else with the last row's.
  absl::Status Step(std::span<const int32_t> tokens, int32_t begin, int32_t end, bool all_rows,
                    std::vector<float>& logits) {
    if (end > batch_.max_blocks_per_seq * table_.block_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a sequence of ", end, " tokens is longer than the model's context (",
                       runner_.config().max_position_embeddings, ")"));
    }
    while (table_.num_blocks() < table_.BlocksFor(end)) {
      std::optional<BlockId> id = pool_.Allocate();
      if (!id) {
        return absl::ResourceExhaustedError(
            absl::StrCat("out of KV blocks at ", end, " tokens (the runner has ",
                         pool_.num_blocks(), " blocks of ", table_.block_size(), " tokens)"));
      }
      table_.AppendBlock(*id);
      batch_.block_table[table_.num_blocks() - 1] = *id;
    }
    batch_.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
    batch_.positions.clear();
    batch_.slot_mapping.clear();
    batch_.logits_rows.clear();
    for (int32_t i = begin; i < end; ++i) {
      batch_.positions.push_back(i);
      batch_.slot_mapping.push_back(table_.SlotOf(i));
      if (all_rows) batch_.logits_rows.push_back(i - begin);
    }
    if (!all_rows) batch_.logits_rows.push_back(end - begin - 1);
    batch_.query_start.assign({0, end - begin});
    batch_.context_len.assign({end});
    table_.set_num_tokens(end);
    logits.resize(batch_.logits_rows.size() * static_cast<size_t>(vocab_));
    return runner_.Forward(batch_, logits);
  }

 private:
  ModelRunner& runner_;
  BlockPool pool_;
  BlockTable table_;
  BatchInput batch_;
  int vocab_;
};

int32_t Argmax(const float* row, int n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// log(sum(exp(row))) in double, so that near-identical distributions give
// KL values far below float's resolution of a log-probability.
double LogSumExp(const float* row, int n) {
  const double m = *std::max_element(row, row + n);
  double s = 0;
  for (int j = 0; j < n; ++j) s += std::exp(static_cast<double>(row[j]) - m);
  return m + std::log(s);
}

// Accumulated over every prediction of every story for one format.
struct Totals {
  double nll = 0;
  double kl = 0;
  double max_kl = 0;
  int64_t top1_agree = 0;
  int64_t greedy_agree = 0;
  int32_t greedy_full = 0;
};

}  // namespace

std::vector<std::string> SplitStories(std::string_view text) {
  std::vector<std::string> stories;
  std::string story;
  auto flush = [&] {
    std::string trimmed(absl::StripAsciiWhitespace(story));
    story.clear();
    if (!trimmed.empty()) stories.push_back(std::move(trimmed));
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    if (absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size())) ==
        absl::string_view(kStorySeparator.data(), kStorySeparator.size())) {
      flush();
    } else {
      story.append(line.data(), line.size());
      story.push_back('\n');
    }
    pos = eol + 1;
  }
  flush();
  return stories;
}

std::vector<std::vector<int32_t>> TokenizeStories(std::string_view text, const Tokenizer& tokenizer,
                                                  int32_t max_tokens, int32_t max_stories) {
  std::vector<std::vector<int32_t>> stories;
  for (const std::string& story : SplitStories(text)) {
    if (max_stories > 0 && static_cast<int32_t>(stories.size()) >= max_stories) break;
    std::vector<int32_t> ids = tokenizer.Encode(story, /*add_bos=*/true);
    if (max_tokens > 0 && static_cast<int32_t>(ids.size()) > max_tokens) ids.resize(max_tokens);
    stories.push_back(std::move(ids));
  }
  return stories;
}

const KvFormatQuality* KvQualityReport::Find(const KvDtypeSpec& dtype) const {
  for (const KvFormatQuality& f : formats) {
    if (f.dtype == dtype) return &f;
  }
  return nullptr;
}

absl::StatusOr<std::vector<int32_t>> GreedyDecode(ModelRunner& runner,
                                                  std::span<const int32_t> prompt,
                                                  int32_t max_new_tokens,
                                                  bool stop_at_stop_tokens) {
  const ModelConfig& c = runner.config();
  if (prompt.empty()) return absl::InvalidArgumentError("GreedyDecode: the prompt is empty");
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  std::vector<float> logits;
  OneSequence seq(runner);
  int32_t cached = 0;
  while (static_cast<int32_t>(generated.size()) < max_new_tokens &&
         static_cast<int32_t>(tokens.size()) < c.max_position_embeddings) {
    const int32_t len = static_cast<int32_t>(tokens.size());
    KV_RETURN_IF_ERROR(seq.Step(tokens, cached, len, /*all_rows=*/false, logits));
    cached = len;
    const int32_t next = Argmax(logits.data(), c.vocab_size);
    generated.push_back(next);
    if (stop_at_stop_tokens && c.IsStopToken(next)) break;
    tokens.push_back(next);
  }
  return generated;
}

absl::StatusOr<KvQualityReport> EvaluateKvQuality(const std::vector<std::vector<int32_t>>& stories,
                                                  const KvRunnerFactory& make_runner,
                                                  const KvQualityOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.chunk_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_tokens must be >= 1, got ", options.chunk_tokens));
  }
  if (options.num_prompts < 0 || options.prompt_tokens < 1 || options.continuation < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "greedy agreement needs num_prompts >= 0, prompt_tokens >= 1, continuation >= 0; got ",
        options.num_prompts, ", ", options.prompt_tokens, ", ", options.continuation));
  }
  std::vector<KvDtypeSpec> dtypes = {KvDtype::kFp32};
  std::vector<std::string> weight_names = {"fp32"};
  const bool by_weights = !options.weight_dtypes.empty();
  if (by_weights) {
    for (const std::string& w : options.weight_dtypes) {
      dtypes.push_back(KvDtype::kFp32);
      weight_names.push_back(w);
    }
  } else {
    for (const KvDtypeSpec& d : options.dtypes) {
      if (std::find(dtypes.begin(), dtypes.end(), d) == dtypes.end()) dtypes.push_back(d);
    }
    weight_names.resize(dtypes.size(), "fp32");
  }
  std::vector<std::string> low_rank(dtypes.size());
  std::vector<KvCrossLayerSpec> cross(dtypes.size());
  // Low-rank, then cross-layer rows: one per format (fp32 alone when none).
  std::vector<KvDtypeSpec> extra_formats = options.dtypes;
  if (extra_formats.empty()) extra_formats.push_back(KvDtype::kFp32);
  auto add_rows = [&](const std::string& file, const KvCrossLayerSpec& xl) {
    for (const KvDtypeSpec& d : extra_formats) {
      dtypes.push_back(d);
      weight_names.push_back("fp32");
      low_rank.push_back(file);
      cross.push_back(xl);
    }
  };
  for (const std::string& file : options.low_rank) add_rows(file, {});
  for (const KvCrossLayerSpec& xl : options.cross_layer) add_rows("", xl);
  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const KvDtypeSpec& d = dtypes[i];
    KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> r,
                        !low_rank[i].empty() ? options.make_low_rank_runner(d, low_rank[i])
                        : cross[i].enabled() ? options.make_cross_layer_runner(d, cross[i])
                        : by_weights         ? options.make_weight_runner(weight_names[i])
                                             : make_runner(d));
    if (d.is_uniform() && r->kv_format().dtype() != d.first_dtype()) {
      return absl::InternalError(absl::StrCat("the runner made for ", d.ToString(), " stores ",
                                              std::string(KvDtypeName(r->kv_format().dtype()))));
    }
    runners.push_back(std::move(r));
  }
  const ModelConfig& config = runners[0]->config();
  const int vocab = config.vocab_size;
  const int32_t max_len = config.max_position_embeddings;

  std::vector<const std::vector<int32_t>*> usable;
  int64_t predictions = 0;
  for (const std::vector<int32_t>& s : stories) {
    if (s.size() < 2) continue;
    if (static_cast<int64_t>(s.size()) > max_len) {
      return absl::InvalidArgumentError(absl::StrCat("a story of ", s.size(),
                                                     " tokens is longer than the model's context (",
                                                     max_len, "); truncate it"));
    }
    for (int32_t t : s) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", t, " is outside the vocabulary (", vocab, ")"));
      }
    }
    usable.push_back(&s);
    predictions += static_cast<int64_t>(s.size()) - 1;
  }
  if (usable.empty()) {
    return absl::InvalidArgumentError("no story has the two tokens a prediction needs");
  }
  std::vector<std::span<const int32_t>> prompts;
  if (options.continuation > 0 && options.prompt_tokens < max_len) {
    for (const std::vector<int32_t>* s : usable) {
      if (static_cast<int32_t>(prompts.size()) >= options.num_prompts) break;
      if (static_cast<int32_t>(s->size()) >= options.prompt_tokens) {
        prompts.emplace_back(s->data(), options.prompt_tokens);
      }
    }
  }

  const int num_formats = static_cast<int>(dtypes.size());
  const int64_t total =
      (predictions + static_cast<int64_t>(prompts.size()) * options.continuation) * num_formats;
  int64_t done = 0;
  auto advance = [&](int64_t n) {
    done += n;
    if (options.progress) options.progress(done, total);
  };

  std::vector<Totals> totals(num_formats);
  std::vector<std::unique_ptr<OneSequence>> seqs;
  for (auto& r : runners) seqs.push_back(std::make_unique<OneSequence>(*r));
  std::vector<float> ref_logits;  // [predictions of the story][vocab]
  std::vector<double> ref_lse;    // [predictions of the story]
  std::vector<int32_t> ref_top1;  // [predictions of the story]
  std::vector<float> logits;

  // Teacher forcing, story-major: fp32 first, its logits kept for the others.
  for (const std::vector<int32_t>* story : usable) {
    const std::span<const int32_t> tokens(*story);
    // The last token predicts nothing.
    const int32_t rows = static_cast<int32_t>(tokens.size()) - 1;
    ref_logits.resize(static_cast<size_t>(rows) * vocab);
    ref_lse.resize(rows);
    ref_top1.resize(rows);
    for (int f = 0; f < num_formats; ++f) {
      OneSequence& seq = *seqs[f];
      Totals& acc = totals[f];
      for (int32_t begin = 0; begin < rows; begin += options.chunk_tokens) {
        const int32_t end = std::min(rows, begin + options.chunk_tokens);
        KV_RETURN_IF_ERROR(seq.Step(tokens, begin, end, /*all_rows=*/true, logits));
        for (int32_t i = begin; i < end; ++i) {
          const float* row = logits.data() + static_cast<size_t>(i - begin) * vocab;
          const double lse = LogSumExp(row, vocab);
          acc.nll += lse - row[tokens[i + 1]];
          const int32_t top1 = Argmax(row, vocab);
          float* ref = ref_logits.data() + static_cast<size_t>(i) * vocab;
          if (f == 0) {
            std::copy(row, row + vocab, ref);
            ref_lse[i] = lse;
            ref_top1[i] = top1;
            ++acc.top1_agree;
            continue;
          }
          acc.top1_agree += top1 == ref_top1[i] ? 1 : 0;
          double kl = 0;
          for (int j = 0; j < vocab; ++j) {
            const double ref_logp = ref[j] - ref_lse[i];
            kl += std::exp(ref_logp) * (ref_logp - (row[j] - lse));
          }
          kl = std::max(kl, 0.0);  // rounding can dip a hair below the true value >= 0
          acc.kl += kl;
          acc.max_kl = std::max(acc.max_kl, kl);
        }
        advance(end - begin);
      }
      seq.Reset();
    }
  }
  seqs.clear();

  // Greedy continuations: fp32's once per prompt, each format against it.
  for (std::span<const int32_t> prompt : prompts) {
    std::vector<int32_t> ref;
    for (int f = 0; f < num_formats; ++f) {
      KV_ASSIGN_OR_RETURN(std::vector<int32_t> out,
                          GreedyDecode(*runners[f], prompt, options.continuation,
                                       /*stop_at_stop_tokens=*/true));
      if (f == 0) ref = out;
      const size_t n = std::min(ref.size(), out.size());
      size_t agree = 0;
      while (agree < n && ref[agree] == out[agree]) ++agree;
      totals[f].greedy_agree += static_cast<int64_t>(agree);
      totals[f].greedy_full += out == ref ? 1 : 0;
      advance(options.continuation);
    }
  }

  KvQualityReport report;
  report.num_stories = static_cast<int32_t>(usable.size());
  report.num_predictions = predictions;
  report.num_prompts = static_cast<int32_t>(prompts.size());
  report.prompt_tokens = options.prompt_tokens;
  report.continuation = options.continuation;
  report.block_size = runners[0]->kv_format().block_size();
  // Bytes as the pools allocate them (kv_layers.h), fp32 tails as on the CPU.
  const KvLayerShape shape{config.num_layers, config.num_kv_heads,     config.head_dim,
                           report.block_size, options.int4_group_size, KvElem::kFp32};
  KV_ASSIGN_OR_RETURN(KvLayers fp16, ResolveKvLayers(KvDtype::kFp16, shape));
  const double fp16_bytes = static_cast<double>(fp16.bytes_per_token());
  for (int f = 0; f < num_formats; ++f) {
    const Totals& acc = totals[f];
    KvFormatQuality q;
    q.dtype = dtypes[f];
    q.weight_dtype = weight_names[f];
    q.low_rank = low_rank[f];
    q.cross_layer = cross[f];
    KV_ASSIGN_OR_RETURN(KvLayers layers,
                        ResolveKvLayers(dtypes[f], shape, "cache.kv_dtype", {}, cross[f]));
    for (const KvFormat& fmt : layers.formats) {
      if (fmt.v().elem == KvElem::kInt4 && q.low_rank.empty()) {
        report.int4_group_size = fmt.v().group_size;
      }
    }
    q.bytes_per_token = layers.bytes_per_token();
    if (!q.low_rank.empty()) {  // narrower pages: what the runner's pool allocates
      const int64_t per_block = runners[f]->memory_info().kv_bytes_per_block;
      q.bytes_per_token = (per_block + report.block_size - 1) / report.block_size;
    }
    q.bytes_vs_fp16 = q.bytes_per_token / fp16_bytes;
    q.perplexity = std::exp(acc.nll / static_cast<double>(predictions));
    q.mean_kl = acc.kl / static_cast<double>(predictions);
    q.max_kl = acc.max_kl;
    q.top1_agreement = static_cast<double>(acc.top1_agree) / static_cast<double>(predictions);
    if (!prompts.empty()) {
      q.mean_greedy_agreement =
          static_cast<double>(acc.greedy_agree) / static_cast<double>(prompts.size());
      q.greedy_full_match = static_cast<double>(acc.greedy_full) / prompts.size();
    }
    report.formats.push_back(q);
  }
  const double ref_ppl = report.formats[0].perplexity;
  for (KvFormatQuality& q : report.formats) {
    q.delta_ppl_percent = (q.perplexity / ref_ppl - 1.0) * 100.0;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string KvQualityTable(const KvQualityReport& report) {
  int width = 9;
  bool by_weights = false;
  for (const KvFormatQuality& q : report.formats) {
    width = std::max(width, static_cast<int>(q.dtype.ToString().size()));
    by_weights |= q.weight_dtype != "fp32";
  }
  auto name = [&](const KvFormatQuality& q) {
    if (!q.low_rank.empty()) return absl::StrCat(q.dtype.ToString(), " + ", q.low_rank);
    if (q.cross_layer.enabled()) {
      return absl::StrCat(q.dtype.ToString(), " + cross-layer ", q.cross_layer.ToString());
    }
    return by_weights ? q.weight_dtype : q.dtype.ToString();
  };
  for (const KvFormatQuality& q : report.formats) {
    width = std::max(width, static_cast<int>(name(q).size()));
  }
  if (by_weights) {
    for (const KvFormatQuality& q : report.formats) {
      width = std::max(width, static_cast<int>(q.weight_dtype.size()));
    }
  }
  // "Δ" is two bytes but one column, hence its field is a byte wider.
  std::string out = absl::StrFormat("%-*s %11s %8s %9s %10s %10s %11s %16s\n", width,
                                    by_weights ? "weights" : "format", "bytes/token", "vs fp16",
                                    "ppl", "Δppl%", "mean KL", "top-1 agree", "greedy agree len");
  for (const KvFormatQuality& q : report.formats) {
    absl::StrAppendFormat(&out, "%-*s %11d %7.3fx %9.4f %+8.3f%% %10.2e %10.2f%% %16.1f\n", width,
                          name(q), q.bytes_per_token, q.bytes_vs_fp16, q.perplexity,
                          q.delta_ppl_percent, q.mean_kl, q.top1_agreement * 100.0,
                          q.mean_greedy_agreement);
  }
  return out;
}

std::string KvQualityJson(const KvQualityReport& report) {
  nlohmann::json j;
  j["model"] = report.model;
  j["text"] = report.text;
  j["stories"] = report.num_stories;
  j["predictions"] = report.num_predictions;
  j["prompts"] = report.num_prompts;
  j["prompt_tokens"] = report.prompt_tokens;
  j["continuation"] = report.continuation;
  j["block_size"] = report.block_size;
  j["int4_group_size"] = report.int4_group_size;
  j["seconds"] = report.seconds;
  nlohmann::json formats = nlohmann::json::array();
  for (const KvFormatQuality& q : report.formats) {
    formats.push_back(
        {{"kv_dtype", q.dtype.ToString()},
         {"weight_dtype", q.weight_dtype},
         {"low_rank", q.low_rank.empty() ? nlohmann::json() : nlohmann::json(q.low_rank)},
         {"cross_layer",
          q.cross_layer.enabled() ? nlohmann::json(q.cross_layer.from_layer) : nlohmann::json()},
         {"cross_layer_threshold",
          q.cross_layer.enabled() ? nlohmann::json(q.cross_layer.threshold) : nlohmann::json()},
         {"cross_layer_retain",
          q.cross_layer.enabled() ? nlohmann::json(q.cross_layer.retain) : nlohmann::json()},
         {"ppl", q.perplexity},
         {"bytes_per_token", q.bytes_per_token},
         {"bytes_vs_fp16", q.bytes_vs_fp16},
         {"perplexity", q.perplexity},
         {"delta_ppl_percent", q.delta_ppl_percent},
         {"mean_kl", q.mean_kl},
         {"max_kl", q.max_kl},
         {"top1_agreement", q.top1_agreement},
         {"mean_greedy_agreement", q.mean_greedy_agreement},
         {"greedy_full_match", q.greedy_full_match}});
  }
  j["formats"] = std::move(formats);
  return j.dump(2) + "\n";
}

}  // namespace kvserve
