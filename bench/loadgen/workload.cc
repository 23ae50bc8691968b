#include "bench/loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <span>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace kvserve::bench {
namespace {

constexpr char kStorySeparator[] = "<|endoftext|>";

// Text of the corpus from `start`, `length` chars, wrapping around its end.
std::string Wrapped(const std::string& corpus, size_t start, size_t length) {
  std::string out;
  out.reserve(length);
  while (out.size() < length) {
    const size_t n = std::min(length - out.size(), corpus.size() - start);
    out.append(corpus, start, n);
    start = 0;
  }
  return out;
}

}  // namespace

const char* WorkloadKindName(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kFixed:
      return "fixed";
    case WorkloadKind::kShareGpt:
      return "sharegpt";
    case WorkloadKind::kSharedPrefix:
      return "shared_prefix";
    case WorkloadKind::kLongContext:
      return "long_context";
    case WorkloadKind::kLongDocument:
      return "long_document";
    case WorkloadKind::kMultiTurn:
      return "multi_turn";
  }
  return "?";
}

absl::StatusOr<WorkloadKind> ParseWorkloadKind(std::string_view name) {
  const std::string n =
      absl::StrReplaceAll(absl::string_view(name.data(), name.size()), {{"-", "_"}});
  for (WorkloadKind k :
       {WorkloadKind::kFixed, WorkloadKind::kShareGpt, WorkloadKind::kSharedPrefix,
        WorkloadKind::kLongContext, WorkloadKind::kLongDocument, WorkloadKind::kMultiTurn}) {
    if (n == WorkloadKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--workload: expected one of fixed, sharegpt, shared_prefix, long_context, "
                   "long_document, multi_turn, got '",
                   n, "'"));
}

PromptSource::PromptSource(std::string corpus, const Tokenizer* tokenizer, double chars_per_token)
    : corpus_(std::move(corpus)), tokenizer_(tokenizer), chars_per_token_(chars_per_token) {
  if (tokenizer_ != nullptr) {
    bos_tokens_ = static_cast<int>(tokenizer_->Encode("", /*add_bos=*/true).size());
  }
}

absl::StatusOr<PromptSource> PromptSource::FromText(std::string corpus, const Tokenizer* tokenizer,
                                                    double chars_per_token) {
  if (!(chars_per_token > 0)) {
    return absl::InvalidArgumentError("--chars-per-token: must be > 0");
  }
  std::string joined;
  for (absl::string_view line : absl::StrSplit(corpus, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line == kStorySeparator) continue;
    // Paragraphs run on with a space: a newline is a token of its own in
    // some tokenizers (and a space in others), which makes exact cuts harder.
    absl::StrAppend(&joined, line, " ");
  }
  if (joined.size() < 64) {
    return absl::InvalidArgumentError("--dataset: the corpus has almost no text");
  }
  return PromptSource(std::move(joined), tokenizer, chars_per_token);
}

absl::StatusOr<PromptSource> PromptSource::FromFile(const std::string& path,
                                                    const Tokenizer* tokenizer,
                                                    double chars_per_token) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--dataset: cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<PromptSource> s = FromText(ss.str(), tokenizer, chars_per_token);
  if (!s.ok()) {
    return absl::Status(s.status().code(), absl::StrCat(s.status().message(), " (", path, ")"));
  }
  return s;
}

size_t PromptSource::RandomWordStart(std::mt19937_64& rng) const {
  // Start at a random word: never at a story's beginning on purpose, so
  // unrelated prompts do not share a cacheable prefix by accident.
  size_t start = rng() % corpus_.size();
  while (start < corpus_.size() && !absl::ascii_isspace(corpus_[start])) ++start;
  while (start < corpus_.size() && absl::ascii_isspace(corpus_[start])) ++start;
  return start >= corpus_.size() ? 0 : start;
}

bool PromptSource::CutAt(size_t start, int tokens, PromptPiece* piece) const {
  // Encode a window long enough to hold `tokens` whole tokens (the last one
  // of a window may be a cut word), then look for a cut near `tokens` whose
  // text encodes back to exactly `tokens` ids: decoding and re-encoding can
  // merge or split pieces at the edges ("had an " + "id" is 3 + 2 tokens, but
  // "had an id" also 5).
  std::vector<int32_t> ids;
  for (size_t window = static_cast<size_t>(tokens) * 8 + 32;; window *= 2) {
    ids = tokenizer_->Encode(Wrapped(corpus_, start, window), /*add_bos=*/false);
    if (static_cast<int>(ids.size()) > tokens + 8 || window > corpus_.size() * 64) break;
  }
  const int available = static_cast<int>(ids.size());
  for (int delta : {0, 1, -1, 2, -2, 3, -3, 4, -4}) {
    const int cut = tokens + delta;
    if (cut < 1 || cut > available) continue;
    std::string text(absl::StripAsciiWhitespace(
        tokenizer_->Decode(std::span<const int32_t>(ids.data(), static_cast<size_t>(cut)))));
    std::vector<int32_t> again = tokenizer_->Encode(text, /*add_bos=*/false);
    if (static_cast<int>(again.size()) == tokens || delta == 0) {
      piece->text = std::move(text);
      piece->ids = std::move(again);
    }
    if (static_cast<int>(piece->ids.size()) == tokens) return true;
  }
  // No exact text here: the ids stay exact, the text is the plain cut.
  piece->ids.assign(ids.begin(), ids.begin() + std::min(tokens, available));
  return false;
}

PromptPiece PromptSource::Take(int tokens, std::mt19937_64& rng) const {
  PromptPiece piece;
  if (tokens <= 0) return piece;
  if (tokenizer_ == nullptr) {
    const size_t start = RandomWordStart(rng);
    const size_t chars = std::max<size_t>(1, std::lround(tokens * chars_per_token_));
    std::string text = Wrapped(corpus_, start, chars);
    // End at a word boundary when there is one.
    if (size_t cut = text.rfind(' '); cut != std::string::npos && cut > chars / 2) {
      text.resize(cut);
    }
    piece.text = std::move(text);
    return piece;
  }
  // A few starts, in case the first has no cut with an exact text.
  for (int attempt = 0; attempt < 8; ++attempt) {
    PromptPiece p;
    const bool exact = CutAt(RandomWordStart(rng), tokens, &p);
    if (attempt == 0 || exact) piece = std::move(p);
    if (exact) break;
  }
  return piece;
}

absl::StatusOr<std::vector<BenchRequest>> BuildWorkload(const WorkloadSpec& spec,
                                                        const PromptSource& source) {
  if (spec.num_requests < 0) return absl::InvalidArgumentError("--num-prompts: must be >= 0");
  if (spec.input_len < 1) return absl::InvalidArgumentError("--input-len: must be >= 1");
  if (spec.output_len < 1) return absl::InvalidArgumentError("--output-len: must be >= 1");
  const int bos = source.bos_tokens();
  const Tokenizer* tok = source.tokenizer();
  // The seed and the shape together pick the prompts, so two different
  // workloads run against one server (whose prefix cache outlives a run) do
  // not start their prompts at the same places.
  std::seed_seq seq{static_cast<uint32_t>(spec.seed),       static_cast<uint32_t>(spec.seed >> 32),
                    static_cast<uint32_t>(spec.kind),       static_cast<uint32_t>(spec.input_len),
                    static_cast<uint32_t>(spec.output_len), static_cast<uint32_t>(spec.groups),
                    static_cast<uint32_t>(spec.prefix_len), static_cast<uint32_t>(spec.suffix_len)};
  std::mt19937_64 rng(seq);
  // Without the tokenizer lengths are estimates: leave a tenth of the
  // context as slack (and room for a chat template).
  const int context = tok == nullptr ? spec.max_model_len * 9 / 10 : spec.max_model_len;

  auto make = [&](const std::vector<const PromptPiece*>& pieces, int wanted_tokens,
                  int max_tokens) {
    BenchRequest r;
    for (const PromptPiece* p : pieces) {
      if (p->text.empty()) continue;
      if (!r.prompt.empty()) r.prompt += ' ';
      r.prompt += p->text;
    }
    r.max_tokens = max_tokens;
    r.input_tokens = wanted_tokens;
    if (tok != nullptr) {
      r.prompt_ids = tok->Encode("", /*add_bos=*/true);
      for (const PromptPiece* p : pieces) {
        r.prompt_ids.insert(r.prompt_ids.end(), p->ids.begin(), p->ids.end());
      }
      r.input_tokens = static_cast<int>(r.prompt_ids.size());
    }
    return r;
  };
  auto check_fits = [&](int input, int output) -> absl::Status {
    if (spec.max_model_len > 0 && input + output > spec.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat("--input-len + --output-len (", input, " + ",
                                                     output, ") exceed max_model_len (",
                                                     spec.max_model_len, ")"));
    }
    return absl::OkStatus();
  };

  std::vector<BenchRequest> out;
  out.reserve(static_cast<size_t>(spec.num_requests));
  switch (spec.kind) {
    case WorkloadKind::kFixed: {
      if (absl::Status s = check_fits(spec.input_len, spec.output_len); !s.ok()) return s;
      for (int i = 0; i < spec.num_requests; ++i) {
        PromptPiece p = source.Take(spec.input_len - bos, rng);
        out.push_back(make({&p}, spec.input_len, spec.output_len));
      }
      break;
    }
    case WorkloadKind::kShareGpt: {
      if (spec.input_sigma < 0 || spec.output_sigma < 0) {
        return absl::InvalidArgumentError("--input-sigma / --output-sigma: must be >= 0");
      }
      std::lognormal_distribution<double> in_dist(std::log(spec.input_len), spec.input_sigma);
      std::lognormal_distribution<double> out_dist(std::log(spec.output_len), spec.output_sigma);
      const int cap = context > 0 ? context : 1 << 30;
      const int min_len = std::max(1, spec.min_len);
      for (int i = 0; i < spec.num_requests; ++i) {
        int in = std::clamp(static_cast<int>(std::lround(in_dist(rng))), min_len, cap);
        int gen = std::clamp(static_cast<int>(std::lround(out_dist(rng))), min_len, cap);
        if (in + gen > cap) in = std::max(min_len, cap - gen);
        if (in + gen > cap) gen = std::max(1, cap - in);
        PromptPiece p = source.Take(in - bos, rng);
        out.push_back(make({&p}, in, gen));
      }
      break;
    }
    case WorkloadKind::kSharedPrefix:
    case WorkloadKind::kLongDocument:
    case WorkloadKind::kMultiTurn: {
      if (spec.groups < 1) return absl::InvalidArgumentError("--groups: must be >= 1");
      if (spec.prefix_len < 1 || spec.suffix_len < 1) {
        return absl::InvalidArgumentError("--prefix-len / --suffix-len: must be >= 1");
      }
      const bool multi_turn = spec.kind == WorkloadKind::kMultiTurn;
      // multi_turn's last round has the longest prompts: its first turn plus
      // a new part for each turn before.
      const int rounds = (spec.num_requests + spec.groups - 1) / spec.groups;
      const int longest = multi_turn ? spec.prefix_len + std::max(0, rounds - 1) * spec.suffix_len
                                     : spec.prefix_len + spec.suffix_len;
      if (absl::Status s = check_fits(longest, spec.output_len); !s.ok()) return s;
      // Per group its prefix, then (multi_turn) every turn's new part so far.
      std::vector<std::vector<PromptPiece>> parts(static_cast<size_t>(spec.groups));
      for (std::vector<PromptPiece>& p : parts)
        p.push_back(source.Take(spec.prefix_len - bos, rng));
      for (int i = 0; i < spec.num_requests; ++i) {
        const int g = i % spec.groups;
        const int turn = i / spec.groups;
        std::vector<PromptPiece>& own = parts[static_cast<size_t>(g)];
        std::vector<const PromptPiece*> pieces;
        PromptPiece suffix;
        if (!multi_turn) {
          suffix = source.Take(spec.suffix_len, rng);
          pieces = {&own[0], &suffix};
        } else {
          if (turn > 0) own.push_back(source.Take(spec.suffix_len, rng));
          for (const PromptPiece& p : own) pieces.push_back(&p);
        }
        const int input = multi_turn ? spec.prefix_len + turn * spec.suffix_len
                                     : spec.prefix_len + spec.suffix_len;
        BenchRequest r = make(pieces, input, spec.output_len);
        r.group = g;
        if (spec.kind != WorkloadKind::kSharedPrefix) r.turn = turn;
        out.push_back(std::move(r));
      }
      if (spec.kind == WorkloadKind::kSharedPrefix) std::shuffle(out.begin(), out.end(), rng);
      break;
    }
    case WorkloadKind::kLongContext: {
      if (spec.max_model_len <= 0) {
        return absl::InvalidArgumentError(
            "--max-model-len: long_context needs it (the server did not report one)");
      }
      const int input = context - spec.output_len;
      if (input < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--output-len: ", spec.output_len,
                                                       " leaves no room for a prompt in ",
                                                       spec.max_model_len, " tokens"));
      }
      for (int i = 0; i < spec.num_requests; ++i) {
        PromptPiece p = source.Take(input - bos, rng);
        out.push_back(make({&p}, input, spec.output_len));
      }
      break;
    }
  }
  return out;
}

}  // namespace kvserve::bench
