// grammar_bench: the cost of constrained decoding's CPU side on a real
// vocabulary: building the vocabulary trie, compiling a 50-property JSON
// schema, and the token mask per decoding step.
//
//   build/bench/grammar_bench --tokenizer FILE [--steps N] [--json FILE]
//
// FILE is a tokenizer.json (Llama 3: 128,256 tokens) or a SentencePiece
// .model (stories260K's tok512.model). The mask is timed along random walks:
// each step fills the mask of the current state, draws a token uniformly
// from it and feeds its bytes, until the grammar ends (then a new walk),
// for --steps steps. Reported: the mean over all steps (masks cached per
// state after their first walk, as in serving, where requests of one schema
// share the compiled grammar), the mean of the steps that walked the trie
// (a state seen for the first time: over the long tokens only when a cached
// state with the same canonical key gives the short ones), the mean of those
// that walked all of it, the 99th percentile of all steps, and the fraction
// served from the cache. Each is given twice: in wall-clock time and in the
// thread's CPU time (CLOCK_THREAD_CPUTIME_ID), which a loaded machine does
// not inflate.
#include <time.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/grammar/grammar_compiler.h"
#include "model/tokenizer/hf_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvserve::CompiledGrammar;
using kvserve::GrammarBuilder;
using kvserve::GrammarMatcher;
using kvserve::GrammarSpec;
using kvserve::TokenVocab;

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// This thread's CPU time in microseconds.
double CpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// 50 properties of every supported kind, all required (OpenAI strict).
std::string FiftyPropertySchema() {
  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  std::vector<std::string> names;
  for (int i = 0; i < 50; ++i) {
    const std::string name = absl::StrCat("field_", i);
    names.push_back(name);
    switch (i % 5) {
      case 0:
        props[name] = {{"type", "string"}, {"maxLength", 24}};
        break;
      case 1:
        props[name] = {{"type", "integer"}, {"minimum", 0}, {"maximum", 100000}};
        break;
      case 2:
        props[name] = {{"enum", {"red", "green", "blue", "cyan"}}};
        break;
      case 3:
        props[name] = {{"type", "array"}, {"items", {{"type", "boolean"}}}, {"maxItems", 4}};
        break;
      default:
        props[name] = {{"type", "object"},
                       {"properties", {{"x", {{"type", "number"}}}, {"y", {{"type", "null"}}}}},
                       {"required", {"x"}},
                       {"additionalProperties", false}};
    }
  }
  nlohmann::ordered_json s = {{"type", "object"},
                              {"properties", props},
                              {"required", names},
                              {"additionalProperties", false}};
  return s.dump();
}

// One statistic of the per-step cost.
struct Times {
  double mean_us = 0, walk_mean_us = 0, full_walk_mean_us = 0, p99_us = 0;
};

struct MaskStats {
  Times wall, cpu;
  double cached_fraction = 0;
  int64_t steps = 0, outputs = 0;
};

// times[i] with walked[i] / full[i] telling which steps walked the trie.
Times Summarize(std::vector<double> times, const std::vector<char>& walked,
                const std::vector<char>& full) {
  Times t;
  double total = 0, walk_total = 0, full_total = 0;
  int64_t walks = 0, full_walks = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    total += times[i];
    if (walked[i]) walk_total += times[i], ++walks;
    if (full[i]) full_total += times[i], ++full_walks;
  }
  if (times.empty()) return t;
  t.mean_us = total / static_cast<double>(times.size());
  t.walk_mean_us = walks > 0 ? walk_total / static_cast<double>(walks) : 0;
  t.full_walk_mean_us = full_walks > 0 ? full_total / static_cast<double>(full_walks) : 0;
  const size_t k = std::min(times.size() - 1, times.size() * 99 / 100);
  std::nth_element(times.begin(), times.begin() + k, times.end());
  t.p99_us = times[k];
  return t;
}

MaskStats TimeMasks(const std::shared_ptr<const CompiledGrammar>& g, int64_t steps) {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> mask(g->vocab().mask_words());
  std::vector<int32_t> allowed;
  std::vector<double> wall, cpu;
  std::vector<char> walked, full;
  wall.reserve(steps);
  cpu.reserve(steps);
  MaskStats st;
  int64_t walks = 0;
  GrammarMatcher m(g);
  for (int64_t s = 0; s < steps; ++s) {
    if (m.MustEnd() || (m.CanEnd() && rng() % 2 == 0)) {
      m = GrammarMatcher(g);
      ++st.outputs;
    }
    const int64_t walks_before = g->walks(), full_walks_before = g->full_walks();
    const double c0 = CpuUs();
    const auto t0 = Clock::now();
    const int32_t n = m.FillMask(mask);
    const auto t1 = Clock::now();
    const double c1 = CpuUs();
    wall.push_back(Us(t0, t1));
    cpu.push_back(c1 - c0);
    walked.push_back(g->walks() != walks_before);
    full.push_back(g->full_walks() != full_walks_before);
    walks += walked.back();
    if (n == 0) {
      m = GrammarMatcher(g);
      continue;
    }
    allowed.clear();
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
        allowed.push_back(static_cast<int32_t>(w * 32 + std::countr_zero(bits)));
      }
    }
    // Prefer short tokens a little less than uniform would: uniform over a
    // 128k vocabulary inside a string almost never closes it.
    int32_t id = allowed[rng() % allowed.size()];
    if (rng() % 3 == 0) id = allowed[0];
    m.AcceptBytes(g->vocab().bytes(id));
  }
  st.steps = steps;
  st.wall = Summarize(std::move(wall), walked, full);
  st.cpu = Summarize(std::move(cpu), walked, full);
  st.cached_fraction = 1.0 - static_cast<double>(walks) / static_cast<double>(steps);
  return st;
}

nlohmann::json ToJson(const Times& t) {
  return {{"mean_us", t.mean_us},
          {"trie_walk_mean_us", t.walk_mean_us},
          {"full_walk_mean_us", t.full_walk_mean_us},
          {"p99_us", t.p99_us}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, json_path;
  int64_t steps = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: grammar_bench --tokenizer FILE [--steps N] [--json FILE]\n");
      return 2;
    }
    if (a == "--tokenizer") {
      tokenizer_path = argv[++i];
    } else if (a == "--steps") {
      steps = std::stoll(argv[++i]);
    } else if (a == "--json") {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto tok = kvserve::LoadTokenizerFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  const auto t0 = Clock::now();
  std::shared_ptr<const TokenVocab> vocab = TokenVocab::FromTokenizer(*tok->tokenizer);
  const double vocab_ms = Us(t0, Clock::now()) / 1000;

  GrammarSpec fifty;
  fifty.kind = GrammarSpec::Kind::kJsonSchema;
  fifty.text = FiftyPropertySchema();
  fifty.field = "schema";
  double compile_ms = 1e30;
  std::shared_ptr<const CompiledGrammar> fifty_grammar;
  for (int rep = 0; rep < 5; ++rep) {
    const auto c0 = Clock::now();
    GrammarBuilder b;
    if (!kvserve::BuildGrammar(fifty, &b).ok()) return 1;
    fifty_grammar = std::make_shared<const CompiledGrammar>(b.Lower(), vocab);
    compile_ms = std::min(compile_ms, Us(c0, Clock::now()) / 1000);
  }

  struct Case {
    const char* name;
    GrammarSpec spec;
  };
  std::vector<Case> cases;
  cases.push_back({"json_schema_50_properties", fifty});
  GrammarSpec person;
  person.kind = GrammarSpec::Kind::kJsonSchema;
  person.text =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":32},)"
      R"("age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array",)"
      R"("items":{"type":"string","maxLength":12},"maxItems":5}},"required":["name","age","tags"]})";
  cases.push_back({"json_schema_person", person});
  GrammarSpec object;
  object.kind = GrammarSpec::Kind::kJsonObject;
  cases.push_back({"json_object", object});
  GrammarSpec regex;
  regex.kind = GrammarSpec::Kind::kRegex;
  regex.text = "[0-9]{3}-[0-9]{4} [A-Za-z ]{1,40}";
  cases.push_back({"regex", regex});

  std::printf("vocabulary %d tokens, %zu trie nodes, built in %.1f ms\n", vocab->vocab_size(),
              vocab->nodes().size(), vocab_ms);
  std::printf("50-property schema: compiled in %.2f ms (%d NFA states)\n", compile_ms,
              fifty_grammar->num_states());
  std::printf("%-28s %-5s %9s %13s %13s %9s %8s %8s\n", "mask per step", "clock", "mean us",
              "trie-walk us", "full-walk us", "p99 us", "cached", "outputs");
  nlohmann::json out = {{"vocab_size", vocab->vocab_size()},
                        {"trie_nodes", vocab->nodes().size()},
                        {"vocab_build_ms", vocab_ms},
                        {"compile_50_properties_ms", compile_ms},
                        {"masks", nlohmann::json::array()}};
  for (const Case& c : cases) {
    GrammarBuilder b;
    if (!kvserve::BuildGrammar(c.spec, &b).ok()) return 1;
    auto g = std::make_shared<const CompiledGrammar>(b.Lower(), vocab);
    const MaskStats st = TimeMasks(g, steps);
    for (const auto& [clock, t] : {std::pair<const char*, const Times&>{"cpu", st.cpu},
                                   std::pair<const char*, const Times&>{"wall", st.wall}}) {
      std::printf("%-28s %-5s %9.1f %13.1f %13.1f %9.1f %7.1f%% %8lld\n", c.name, clock, t.mean_us,
                  t.walk_mean_us, t.full_walk_mean_us, t.p99_us, 100 * st.cached_fraction,
                  static_cast<long long>(st.outputs));
    }
    nlohmann::json row = ToJson(st.wall);  // wall clock, as before
    row["grammar"] = c.name;
    row["steps"] = st.steps;
    row["cpu"] = ToJson(st.cpu);
    row["cached_fraction"] = st.cached_fraction;
    row["outputs"] = st.outputs;
    out["masks"].push_back(row);
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
