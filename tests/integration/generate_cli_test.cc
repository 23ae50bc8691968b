// `kvserve generate` end to end, through the built binary: greedy decoding of
// stories260K from BOS prints llama2.c's reference text exactly, whatever the
// KV block size, from the llama2.c checkpoint and from the HF directory that
// `kvserve convert` writes; bad flags exit 2 with a message.
//
// llama2.c's run.c with 256 steps and the one-token prompt [BOS] samples a
// token at every position 0..255, so the reference holds 256 generated tokens.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;  // what the chosen streams printed
};

enum class Capture { kStdout, kBoth, kStderr };

// Runs `kvserve ARGS` through the shell and captures the chosen streams.
RunResult RunKvserve(const std::string& args, Capture capture = Capture::kStdout) {
  const char* redirect = capture == Capture::kStdout ? " 2>/dev/null"
                         : capture == Capture::kBoth ? " 2>&1"
                                                     : " 2>&1 >/dev/null";
  const std::string cmd = absl::StrCat("'", testing::KvserveBinary(), "' ", args, redirect);
  RunResult r;
  r.exit_code = testing::RunShell(cmd, &r.out);
  return r;
}

std::string WithoutFinalNewline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string Quote(const std::string& s) { return testing::ShellQuote(s); }

TEST_CASE("kvserve generate prints the reference text greedily at every block size",
          "[integration]") {
  const std::string golden = testing::GoldenGreedyText();
  SECTION("from the llama2.c checkpoint") {
    for (int bs : {1, 16, 64}) {
      RunResult r = RunKvserve(
          absl::StrCat("generate --model ", Quote(testing::Stories260kCheckpoint()),
                       " --prompt '' --max-tokens 256 --temperature 0 --block-size ", bs));
      INFO("block size " << bs);
      REQUIRE(r.exit_code == 0);
      REQUIRE(WithoutFinalNewline(r.out) == golden);
    }
  }
  SECTION("from the HF directory kvserve convert writes") {
    const std::string dir = absl::StrCat(testing::MakeTempDir("generate-hf"), "/stories260k");
    RunResult conv = RunKvserve(
        absl::StrCat("convert --llama2c ", Quote(testing::Stories260kCheckpoint()), " --tokenizer ",
                     Quote(testing::Stories260kTokenizer()), " --out ", Quote(dir)));
    REQUIRE(conv.exit_code == 0);
    for (int bs : {1, 16, 64}) {
      RunResult r = RunKvserve(
          absl::StrCat("generate --model ", Quote(dir),
                       " --prompt '' --max-tokens 256 --temperature 0 --block-size ", bs));
      INFO("block size " << bs);
      REQUIRE(r.exit_code == 0);
      REQUIRE(WithoutFinalNewline(r.out) == golden);
    }
  }
}

TEST_CASE("kvserve generate takes unset sampling flags from generation_config.json",
          "[integration]") {
  const std::string dir = absl::StrCat(testing::MakeTempDir("generate-defaults"), "/stories260k");
  RunResult conv = RunKvserve(
      absl::StrCat("convert --llama2c ", Quote(testing::Stories260kCheckpoint()), " --tokenizer ",
                   Quote(testing::Stories260kTokenizer()), " --out ", Quote(dir)));
  REQUIRE(conv.exit_code == 0);
  // The checkpoint recommends greedy decoding: no --temperature gives the
  // reference text; a flag still wins.
  std::ofstream(dir + "/generation_config.json")
      << R"({"bos_token_id": 1, "eos_token_id": [2, 1], "temperature": 0.0, "top_k": 5})"
      << "\n";
  RunResult greedy =
      RunKvserve(absl::StrCat("generate --model ", Quote(dir), " --prompt '' --max-tokens 256"));
  REQUIRE(greedy.exit_code == 0);
  REQUIRE(WithoutFinalNewline(greedy.out) == testing::GoldenGreedyText());
  RunResult sampled = RunKvserve(absl::StrCat("generate --model ", Quote(dir),
                                              " --prompt '' --max-tokens 64 --temperature 1.5 "
                                              "--seed 7"));
  REQUIRE(sampled.exit_code == 0);
  REQUIRE(testing::GoldenGreedyText().rfind(sampled.out, 0) != 0);  // not the greedy text
}

TEST_CASE("kvserve generate stops at max-tokens and reports speed on stderr", "[integration]") {
  const std::string model = Quote(testing::Stories260kCheckpoint());
  SECTION("ten greedy tokens are a prefix of the reference") {
    RunResult r = RunKvserve(absl::StrCat("generate --model ", model,
                                          " --max-tokens 10 --temperature 0 --block-size 16"));
    REQUIRE(r.exit_code == 0);
    const std::string text = WithoutFinalNewline(r.out);
    REQUIRE(!text.empty());
    REQUIRE(testing::GoldenGreedyText().rfind(text, 0) == 0);
    REQUIRE(text.size() < 60);
  }
  SECTION("the prompt is not echoed and a seeded sample repeats") {
    const std::string args = absl::StrCat(
        "generate --model ", model,
        " --prompt 'Once upon a time' --max-tokens 40 --temperature 0.9 --top-p 0.9 --seed 7");
    RunResult a = RunKvserve(args);
    RunResult b = RunKvserve(args);
    REQUIRE(a.exit_code == 0);
    REQUIRE(a.out == b.out);
    REQUIRE(a.out.rfind("Once upon a time", 0) != 0);
  }
  SECTION("greedy decoding from BOS ends its story at the next BOS (token 346)") {
    RunResult r =
        RunKvserve(absl::StrCat("generate --model ", model, " --max-tokens 600 --temperature 0"),
                   Capture::kBoth);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.out.rfind(testing::GoldenGreedyText(), 0) == 0);
    // 345 tokens of text plus the BOS that ends it, counted as the daemon's
    // usage.completion_tokens counts it (the same engine).
    REQUIRE(r.out.find("kvserve generate: 346 tokens in") != std::string::npos);
  }
  SECTION("generation stops when the context (512 positions) is full") {
    RunResult r = RunKvserve(
        absl::StrCat("generate --model ", model, " --prompt Tom --max-tokens 600 --temperature 0"),
        Capture::kStderr);
    REQUIRE(r.exit_code == 0);
    // BOS + 2 prompt tokens + 509 generated = 512.
    REQUIRE(r.out.find("kvserve generate: 509 tokens in") != std::string::npos);
  }
  SECTION("stderr carries tokens/s") {
    RunResult r =
        RunKvserve(absl::StrCat("generate --model ", model, " --max-tokens 5 --temperature 0"),
                   Capture::kStderr);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.out.find("tokens/s") != std::string::npos);
  }
}

TEST_CASE("kvserve generate rejects bad flags with exit code 2", "[integration]") {
  const std::string model = Quote(testing::Stories260kCheckpoint());
  SECTION("each bad value names its flag") {
    for (const char* bad :
         {"--max-tokens 0", "--max-tokens ten", "--temperature -1", "--top-p 1.5", "--block-size 0",
          "--kv-dtype fp7", "--device tpu", "--dtype int8", "--bogus 1"}) {
      INFO(bad);
      RunResult r = RunKvserve(absl::StrCat("generate --model ", model, " ", bad), Capture::kBoth);
      REQUIRE(r.exit_code == 2);
      REQUIRE(r.out.find("kvserve generate:") != std::string::npos);
    }
  }
  SECTION("--model is required") {
    RunResult r = RunKvserve("generate --prompt hi", Capture::kBoth);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.out.find("--model is required") != std::string::npos);
  }
  SECTION("--help prints usage and exits 0") {
    RunResult r = RunKvserve("generate --help");
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.out.find("usage: kvserve generate") != std::string::npos);
  }
  SECTION("fp16 weights on the CPU are a runtime error naming model.dtype") {
    RunResult r =
        RunKvserve(absl::StrCat("generate --model ", model, " --dtype fp16"), Capture::kBoth);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.find("model.dtype: fp16: the CPU backend computes in fp32") != std::string::npos);
  }
  SECTION("a missing model is a runtime error naming the path") {
    RunResult r = RunKvserve("generate --model /nonexistent/model.bin", Capture::kBoth);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.find("/nonexistent/model.bin") != std::string::npos);
  }
}

TEST_CASE("kvserve generate --weight-dtype int8 keeps the greedy text and refuses bad names",
          "[integration]") {
  // int8 weights agree with fp32's greedy tokens for the first 235 of 256 on
  // stories260K (tests/model/cpu/quantized_forward_test.cc): 200 tokens of
  // text are the same.
  const std::string args =
      absl::StrCat("generate --model ", Quote(testing::Stories260kCheckpoint()),
                   " --prompt '' --max-tokens 200 --temperature 0");
  RunResult fp32 = RunKvserve(args);
  RunResult int8 = RunKvserve(args + " --weight-dtype int8 --threads 2");
  REQUIRE(fp32.exit_code == 0);
  REQUIRE(int8.exit_code == 0);
  REQUIRE(int8.out == fp32.out);
  REQUIRE(testing::GoldenGreedyText().rfind(WithoutFinalNewline(fp32.out), 0) == 0);
  RunResult bad = RunKvserve(args + " --weight-dtype int9", Capture::kStderr);
  REQUIRE(bad.exit_code == 2);
  REQUIRE(bad.out.find("--weight-dtype: model.weight_dtype: expected auto, fp32, fp16, bf16, int8, "
                       "int4, int4_asym or fp8_e4m3, got 'int9'") != std::string::npos);
  RunResult cuda = RunKvserve(args + " --weight-dtype int4 --device cuda", Capture::kStderr);
  REQUIRE(cuda.exit_code != 0);
  REQUIRE(cuda.out.find("model.weight_dtype: int4 weights run on the CPU only") !=
          std::string::npos);
}

}  // namespace
}  // namespace kvserve
