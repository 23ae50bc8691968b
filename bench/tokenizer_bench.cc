// tokenizer_bench: how fast a tokenizer loads, encodes and decodes.
//
//   build/bench/tokenizer_bench --tokenizer path/to/tokenizer.json
//       --text ../shared/data/tinystories_valid_dev.txt [--repeat 20] [--json out.json]
//
// Loads the tokenizer (tokenizer.json or a SentencePiece .model), then
// encodes the text once with a cold word cache and `repeat` more times warm,
// one thread, and decodes the ids token by token (TokenBytes).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer/hf_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

constexpr char kUsage[] =
    "usage: tokenizer_bench --tokenizer FILE --text FILE [--repeat N] [--json FILE]\n";

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, text_path, json_path;
  int repeat = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    if (a == "--tokenizer") {
      tokenizer_path = argv[++i];
    } else if (a == "--text") {
      text_path = argv[++i];
    } else if (a == "--repeat") {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json") {
      json_path = argv[++i];
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }
  if (tokenizer_path.empty() || text_path.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot open\n", text_path.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  Clock::time_point t0 = Clock::now();
  auto loaded = kvserve::LoadTokenizerFile(tokenizer_path);
  const double load_s = Seconds(t0);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const kvserve::Tokenizer& tok = *loaded->tokenizer;

  t0 = Clock::now();
  std::vector<int32_t> ids = tok.Encode(text, false);
  const double cold_s = Seconds(t0);
  t0 = Clock::now();
  for (int r = 0; r < repeat; ++r) ids = tok.Encode(text, false);
  const double warm_s = Seconds(t0) / repeat;
  t0 = Clock::now();
  size_t bytes = 0;
  for (int r = 0; r < repeat; ++r) {
    int32_t prev = -1;
    for (int32_t id : ids) {
      bytes += tok.TokenBytes(id, prev).size();
      prev = id;
    }
  }
  const double decode_s = Seconds(t0) / repeat;

  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("tokenizer %s: vocab %d, loaded in %.3f s\n", tokenizer_path.c_str(),
              tok.vocab_size(), load_s);
  std::printf("text %s: %zu bytes -> %zu tokens\n", text_path.c_str(), text.size(), ids.size());
  std::printf("encode cold: %.2f MB/s (%.0f tokens/s)\n", mb / cold_s, ids.size() / cold_s);
  std::printf("encode warm: %.2f MB/s (%.0f tokens/s)\n", mb / warm_s, ids.size() / warm_s);
  std::printf("decode (TokenBytes): %.0f tokens/s\n", ids.size() / decode_s);
  if (bytes != text.size() * static_cast<size_t>(repeat)) {
    std::printf("note: decoded %zu bytes per pass, the text has %zu\n", bytes / repeat,
                text.size());
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"tokenizer", tokenizer_path},
                        {"vocab_size", tok.vocab_size()},
                        {"load_s", load_s},
                        {"text_bytes", text.size()},
                        {"tokens", ids.size()},
                        {"encode_cold_mb_s", mb / cold_s},
                        {"encode_warm_mb_s", mb / warm_s},
                        {"decode_tokens_s", ids.size() / decode_s}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}
