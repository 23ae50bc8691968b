// Benchmark workloads: the list of prompts (with their lengths in tokens)
// and output lengths that a run sends, built once, deterministically from a
// seed, before any request goes out.
//
// Kinds (WorkloadSpec fields in brackets):
//   fixed          every request [input_len] prompt tokens, [output_len] new tokens
//   sharegpt       lengths drawn from log-normal distributions shaped like
//                  ShareGPT conversations (a long right tail: a few very long
//                  prompts and answers among many short ones): median
//                  [input_len] with log-space sigma [input_sigma], median
//                  [output_len] with [output_sigma]; clamped to
//                  [min_len, max_model_len] with input + output <= max_model_len
//                  (90% of it when lengths are estimated)
//   shared_prefix  [groups] groups; each has one common prefix of
//                  [prefix_len] tokens and each request adds its own suffix of
//                  [suffix_len] tokens (system prompts, few-shot examples,
//                  multi-turn chat); requests of all groups interleave
//   long_context   prompts filling the context: max_model_len - output_len
//                  tokens (90% of max_model_len when lengths are estimated),
//                  then [output_len] new tokens
//   long_document  [groups] documents of [prefix_len] tokens, and
//                  [num_requests] questions of [suffix_len] tokens each,
//                  asked of the documents in turn (document i % groups), in
//                  that order: with a device pool that holds one document,
//                  each question after a document's first finds it pushed
//                  out by the others (RAG documents asked again)
//   multi_turn     [groups] conversations taking turns, [num_requests] turns
//                  in all, in rounds (conversation i % groups, turn i /
//                  groups): a first turn of [prefix_len] tokens, and every
//                  later turn is the conversation's previous prompt plus
//                  [suffix_len] new tokens (the answer is not carried back:
//                  prompts are built before anything is sent), so a turn
//                  comes back after the other conversations' traffic
//
// Requests are sent in the workload's order (shared_prefix shuffles its
// groups together; the others keep the order they are built in).
//
// Prompt text comes from a corpus file of stories separated by
// "<|endoftext|>" lines (TinyStories), each prompt starting at a random word.
// With the served model's tokenizer the lengths are exact: prompt_ids holds
// exactly the asked number of ids (BOS first), and the text is chosen so that
// it encodes back to them (where a tokenizer cannot, for some word at some
// start, the text may be off by a token: the server's usage then says what
// it counted). Without a tokenizer lengths are estimated from
// chars_per_token.
//
// Thread-safety: PromptSource is immutable after construction; BuildWorkload
// is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer/tokenizer.h"

namespace kvserve::bench {

enum class WorkloadKind {
  kFixed,
  kShareGpt,
  kSharedPrefix,
  kLongContext,
  kLongDocument,
  kMultiTurn
};

// "fixed", "sharegpt", "shared_prefix", "long_context", "long_document", "multi_turn".
const char* WorkloadKindName(WorkloadKind kind);
// Also accepts '-' for '_' ("shared-prefix").
absl::StatusOr<WorkloadKind> ParseWorkloadKind(std::string_view name);

struct WorkloadSpec {
  WorkloadKind kind = WorkloadKind::kFixed;
  int num_requests = 100;
  int input_len = 64;   // fixed: exact; sharegpt: median
  int output_len = 64;  // fixed, shared_prefix, long_context: exact; sharegpt: median
  double input_sigma = 1.0;
  double output_sigma = 0.8;
  int min_len = 4;
  int groups = 4;        // shared_prefix, long_document, multi_turn
  int prefix_len = 256;  // shared_prefix, long_document, multi_turn (the first turn)
  int suffix_len = 16;  // shared_prefix, long_document (a question), multi_turn (a turn's new text)
  int max_model_len = 0;  // 0: unknown (no clamping; long_context needs it)
  uint64_t seed = 0;
};

struct BenchRequest {
  std::string prompt;               // the text sent
  std::vector<int32_t> prompt_ids;  // with a tokenizer: the ids, BOS first; else empty
  int input_tokens = 0;             // what the workload asked for (exact with a tokenizer)
  int max_tokens = 0;
  int group = -1;  // shared_prefix: the group; long_document: the document;
                   // multi_turn: the conversation; else -1
  int turn = -1;   // long_document: the document's question number (0: its first);
                   // multi_turn: the turn (0: the first); else -1
};

// A prompt cut from the corpus.
struct PromptPiece {
  std::string text;
  std::vector<int32_t> ids;  // without BOS; empty without a tokenizer
};

class PromptSource {
 public:
  // `tokenizer` may be null (lengths then estimated); it must outlive the source.
  static absl::StatusOr<PromptSource> FromFile(const std::string& path, const Tokenizer* tokenizer,
                                               double chars_per_token = 4.0);
  static absl::StatusOr<PromptSource> FromText(std::string corpus, const Tokenizer* tokenizer,
                                               double chars_per_token = 4.0);

  // About `tokens` tokens of corpus text (exactly, with a tokenizer) from a
  // random word; no BOS.
  PromptPiece Take(int tokens, std::mt19937_64& rng) const;
  // Tokens the server adds to a text prompt (1 for BOS; 0 without a
  // tokenizer or BOS).
  int bos_tokens() const { return bos_tokens_; }
  const Tokenizer* tokenizer() const { return tokenizer_; }

 private:
  PromptSource(std::string corpus, const Tokenizer* tokenizer, double chars_per_token);
  size_t RandomWordStart(std::mt19937_64& rng) const;
  // `tokens` ids from corpus position `start` into *piece; true when its
  // text also encodes to exactly that many.
  bool CutAt(size_t start, int tokens, PromptPiece* piece) const;

  std::string corpus_;  // the stories' lines joined by spaces
  const Tokenizer* tokenizer_;
  double chars_per_token_;
  int bos_tokens_ = 0;
};

absl::StatusOr<std::vector<BenchRequest>> BuildWorkload(const WorkloadSpec& spec,
                                                        const PromptSource& source);

}  // namespace kvserve::bench
