// `kvserve eval-kv` end to end, through the built binary: on stories260K and
// the first stories of the dev text it prints one table row per format
// (fp32 first, as the reference), writes JSON that parses with the expected
// keys, and rejects bad flags with exit code 2.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace kvserve {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;
};

// Runs `kvserve ARGS` through the shell; captures stdout, and stderr too
// when both_streams.
RunResult RunKvserve(const std::string& args, bool both_streams = false) {
  const std::string cmd = absl::StrCat("'", testing::KvserveBinary(), "' ", args,
                                       both_streams ? " 2>&1" : " 2>/dev/null");
  RunResult r;
  r.exit_code = testing::RunShell(cmd, &r.out);
  return r;
}

std::string Quote(const std::string& s) { return testing::ShellQuote(s); }

std::string DevText() { return testing::SharedDir() + "/data/tinystories_valid_dev.txt"; }

std::string BaseArgs() {
  return absl::StrCat("eval-kv --model ", Quote(testing::Stories260kCheckpoint()), " --text ",
                      Quote(DevText()));
}

// The line of the table that starts with `format` and a space, or "".
std::string TableRow(const std::string& out, const std::string& format) {
  size_t pos = 0;
  while (pos < out.size()) {
    size_t eol = out.find('\n', pos);
    if (eol == std::string::npos) eol = out.size();
    const std::string line = out.substr(pos, eol - pos);
    if (line.rfind(format + " ", 0) == 0) return line;
    pos = eol + 1;
  }
  return "";
}

TEST_CASE("kvserve eval-kv reports fp32 and int8 as a table and JSON", "[integration]") {
  const std::string json_path = testing::MakeTempDir("eval-kv") + "/report.json";
  RunResult r =
      RunKvserve(absl::StrCat(BaseArgs(), " --kv-dtype fp32 --kv-dtype int8 --max-stories 5",
                              " --prompts 3 --continuation 32 --json ", Quote(json_path)));
  REQUIRE(r.exit_code == 0);
  INFO(r.out);

  SECTION("the table has a header and one row per format, fp32 first") {
    REQUIRE(r.out.find("5 stories") != std::string::npos);
    const size_t header = r.out.find("format    bytes/token");
    REQUIRE(header != std::string::npos);
    REQUIRE(r.out.find("mean KL", header) != std::string::npos);
    REQUIRE(r.out.find("top-1 agree", header) != std::string::npos);
    const std::string fp32 = TableRow(r.out, "fp32");
    const std::string int8 = TableRow(r.out, "int8");
    REQUIRE(!fp32.empty());
    REQUIRE(!int8.empty());
    REQUIRE(r.out.find(fp32) < r.out.find(int8));
    // stories260K: 5 layers x 4 kv heads x head_dim 8.
    REQUIRE(fp32.find(" 1280 ") != std::string::npos);
    REQUIRE(fp32.find("+0.000%") != std::string::npos);
    REQUIRE(fp32.find("100.00%") != std::string::npos);
    REQUIRE(int8.find(" 480 ") != std::string::npos);
    REQUIRE(TableRow(r.out, "int4").empty());
  }
  SECTION("the JSON parses and holds every key, with perplexities above 1") {
    const nlohmann::json j = nlohmann::json::parse(testing::ReadFileOrDie(json_path));
    for (const char* key :
         {"model", "text", "stories", "predictions", "prompts", "prompt_tokens", "continuation",
          "block_size", "int4_group_size", "seconds", "formats"}) {
      INFO(key);
      REQUIRE(j.contains(key));
    }
    REQUIRE(j["stories"] == 5);
    REQUIRE(j["prompts"] == 3);
    REQUIRE(j["continuation"] == 32);
    REQUIRE(j["block_size"] == 16);
    REQUIRE(j["predictions"].get<int64_t>() > 500);
    const nlohmann::json& formats = j["formats"];
    REQUIRE(formats.size() == 2);
    REQUIRE(formats[0]["kv_dtype"] == "fp32");
    REQUIRE(formats[1]["kv_dtype"] == "int8");
    for (const nlohmann::json& f : formats) {
      for (const char* key :
           {"bytes_per_token", "bytes_vs_fp16", "perplexity", "delta_ppl_percent", "mean_kl",
            "max_kl", "top1_agreement", "mean_greedy_agreement", "greedy_full_match"}) {
        INFO(f["kv_dtype"] << " " << key);
        REQUIRE(f.contains(key));
      }
      REQUIRE(f["perplexity"].get<double>() > 1.0);
    }
    REQUIRE(formats[0]["bytes_per_token"] == 1280);
    REQUIRE(formats[0]["mean_kl"] == 0.0);
    REQUIRE(formats[0]["top1_agreement"] == 1.0);
    REQUIRE(formats[1]["bytes_per_token"] == 480);
    REQUIRE(formats[1]["bytes_vs_fp16"] == 0.75);
    REQUIRE(formats[1]["mean_kl"].get<double>() > 0.0);
    REQUIRE(formats[1]["delta_ppl_percent"].get<double>() <= 0.5);
  }
}

TEST_CASE("kvserve eval-kv --weight-dtype: one row per weight dtype against fp32 weights",
          "[integration]") {
  const std::string json_path = testing::MakeTempDir("eval-kv-weights") + "/report.json";
  RunResult r = RunKvserve(
      absl::StrCat(BaseArgs(), " --weight-dtype int8 --weight-dtype int4 --max-stories 5",
                   " --prompts 2 --continuation 16 --json ", Quote(json_path)));
  REQUIRE(r.exit_code == 0);
  INFO(r.out);
  REQUIRE(r.out.find("weights   bytes/token") != std::string::npos);
  REQUIRE(!TableRow(r.out, "int8").empty());
  REQUIRE(!TableRow(r.out, "int4").empty());
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFileOrDie(json_path));
  const nlohmann::json& rows = j["formats"];
  REQUIRE(rows.size() == 3);
  const char* names[] = {"fp32", "int8", "int4"};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(rows[i]["weight_dtype"] == names[i]);
    REQUIRE(rows[i]["kv_dtype"] == "fp32");
    REQUIRE(rows[i]["ppl"].get<double>() > 1.0);
    REQUIRE(rows[i]["ppl"] == rows[i]["perplexity"]);
  }
  REQUIRE(rows[0]["delta_ppl_percent"].get<double>() == 0.0);
  REQUIRE(std::abs(rows[1]["delta_ppl_percent"].get<double>()) < 0.5);
  RunResult bad = RunKvserve(absl::StrCat(BaseArgs(), " --weight-dtype fp8_e4m3"), true);
  REQUIRE(bad.exit_code == 2);
  REQUIRE(bad.out.find("--weight-dtype: model.weight_dtype: fp8_e4m3 weights run on CUDA only; "
                       "eval-kv runs the CPU runner") != std::string::npos);
}

TEST_CASE("kvserve eval-kv takes int4_kc and per-layer lists, one format per --kv-dtype",
          "[integration]") {
  RunResult r = RunKvserve(absl::StrCat(BaseArgs(),
                                        " --kv-dtype int4_kc --kv-dtype int8,int4_kc*,int8"
                                        " --kv-dtype int2_kc --kv-dtype int8,int2_kc*,int8"
                                        " --max-stories 3 --prompts 2 --continuation 16"));
  REQUIRE(r.exit_code == 0);
  INFO(r.out);
  // 5 layers of 4 kv heads x 8, as allocated: int4_kc 56 bytes per layer (a
  // block's 864 padded to 896, over 16 tokens), int8 96.
  const std::string kc = TableRow(r.out, "int4_kc");
  const std::string mix = TableRow(r.out, "int8,int4_kc*,int8");
  REQUIRE(kc.find(" 280 ") != std::string::npos);
  REQUIRE(mix.find(" 360 ") != std::string::npos);
  // int2_kc: 40 bytes per layer (608 padded to 640, over 16 tokens).
  REQUIRE(TableRow(r.out, "int2_kc").find(" 200 ") != std::string::npos);
  REQUIRE(TableRow(r.out, "int8,int2_kc*,int8").find(" 312 ") != std::string::npos);
  REQUIRE(r.out.find("format             bytes/token") != std::string::npos);  // widened
  SECTION("a list that does not fit the model's 5 layers is an error naming --kv-dtype") {
    RunResult bad = RunKvserve(absl::StrCat(BaseArgs(), " --kv-dtype fp32,int8 --max-stories 1"),
                               /*both_streams=*/true);
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.out.find("--kv-dtype: 'fp32,int8' names 2 layers but the model has 5") !=
            std::string::npos);
  }
}

TEST_CASE("kvserve eval-kv --cross-layer: one row per format and setting, bytes and JSON",
          "[integration]") {
  const std::string json_path = testing::MakeTempDir("eval-kv-xl") + "/report.json";
  RunResult r = RunKvserve(absl::StrCat(BaseArgs(),
                                        " --kv-dtype fp32 --kv-dtype int8 --cross-layer 2:0.3"
                                        " --max-stories 3 --prompts 2 --continuation 16 --json ",
                                        Quote(json_path)));
  REQUIRE(r.exit_code == 0);
  INFO(r.out);
  // Layers 0, 1, 2 and 4 as plain pages, layer 3's shared page: 832 bytes
  // a block in fp32 (4 x 4096 + 832 over 16 tokens), 512 in int8.
  const std::string fp32 = TableRow(r.out, "fp32 + cross-layer 2:0.3:0.125");
  const std::string int8 = TableRow(r.out, "int8 + cross-layer 2:0.3:0.125");
  REQUIRE(fp32.find(" 1076 ") != std::string::npos);
  REQUIRE(int8.find(" 416 ") != std::string::npos);
  REQUIRE(r.out.find(TableRow(r.out, "int8")) < r.out.find(fp32));  // after the formats
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFileOrDie(json_path));
  REQUIRE(j["formats"].size() == 4);
  REQUIRE(j["formats"][1]["cross_layer"].is_null());
  REQUIRE(j["formats"][2]["cross_layer"] == 2);
  REQUIRE(j["formats"][2]["cross_layer_threshold"] == 0.3);
  REQUIRE(j["formats"][3]["kv_dtype"] == "int8");
  REQUIRE(j["formats"][3]["bytes_per_token"] == 416);
  SECTION("a setting that is not L[:T[:R]] or leaves no pair") {
    RunResult bad = RunKvserve(absl::StrCat(BaseArgs(), " --cross-layer two"), true);
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.out.find("--cross-layer: 'two' is not L[:T[:R]]") != std::string::npos);
    bad = RunKvserve(absl::StrCat(BaseArgs(), " --cross-layer 4 --max-stories 1"), true);
    REQUIRE(bad.exit_code != 0);
    REQUIRE(bad.out.find("cache.cross_layer.from_layer: 4 leaves no pair of layers") !=
            std::string::npos);
  }
}

TEST_CASE("kvserve eval-kv rejects bad flags with exit code 2", "[integration]") {
  SECTION("each bad value names its flag") {
    for (const char* bad :
         {"--kv-dtype fp7", "--kv-dtype int8,fp7", "--block-size 0", "--int4-group-size 48",
          "--max-stories -1", "--context 1", "--chunk 0", "--prompts x", "--bogus 1"}) {
      INFO(bad);
      RunResult r = RunKvserve(absl::StrCat(BaseArgs(), " ", bad), /*both_streams=*/true);
      REQUIRE(r.exit_code == 2);
      REQUIRE(r.out.find("kvserve eval-kv:") != std::string::npos);
    }
  }
  SECTION("--model and --text are required") {
    RunResult r = RunKvserve(absl::StrCat("eval-kv --text ", Quote(DevText())), true);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.out.find("--model is required") != std::string::npos);
    r = RunKvserve(absl::StrCat("eval-kv --model ", Quote(testing::Stories260kCheckpoint())), true);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.out.find("--text is required") != std::string::npos);
  }
  SECTION("--help prints usage and exits 0") {
    RunResult r = RunKvserve("eval-kv --help");
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.out.find("usage: kvserve eval-kv") != std::string::npos);
  }
  SECTION("a missing text file is a runtime error naming the path") {
    RunResult r =
        RunKvserve(absl::StrCat("eval-kv --model ", Quote(testing::Stories260kCheckpoint()),
                                " --text /nonexistent/stories.txt"),
                   true);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.find("/nonexistent/stories.txt") != std::string::npos);
  }
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

TEST_CASE("kvserve eval-kv --policy runs the eviction study: table, JSON and PNG",
          "[integration][eviction]") {
  const std::string dir = testing::MakeTempDir("eval-kv-policy");
  RunResult r =
      RunKvserve(absl::StrCat(BaseArgs(),
                              " --policy all --budget 64 --stream-tokens 700"
                              " --kv-dtype fp32 --json ",
                              Quote(dir + "/study.json"), " --png ", Quote(dir + "/study.png")));
  REQUIRE(r.exit_code == 0);
  INFO(r.out);
  for (const char* run : {"recompute", "none (dense)", "streaming (4 sinks)", "streaming (0 sinks)",
                          "sliding_window", "h2o", "scissorhands", "learned"}) {
    REQUIRE_FALSE(TableRow(r.out, run).empty());
  }
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFileOrDie(dir + "/study.json"));
  REQUIRE(j["runs"].size() == 8);
  for (const auto& run : j["runs"]) {
    for (const char* key : {"policy", "kv_dtype", "budget", "stream_tokens", "ppl", "windows"}) {
      REQUIRE(run.contains(key));
    }
    REQUIRE(run["stream_tokens"] == 700);
    REQUIRE(run["windows"].size() == 3);  // [0, 256), [256, 512), [512, 700)
  }
  const std::string png = testing::ReadFileOrDie(dir + "/study.png");
  REQUIRE(png.substr(1, 3) == "PNG");

  SECTION("the budget sweep") {
    RunResult s = RunKvserve(absl::StrCat(BaseArgs(), " --policy h2o,sliding_window --sweep 2",
                                          " --json ", Quote(dir + "/sweep.json")));
    REQUIRE(s.exit_code == 0);
    const nlohmann::json sj = nlohmann::json::parse(testing::ReadFileOrDie(dir + "/sweep.json"));
    REQUIRE(sj["kind"] == "sweep");
    REQUIRE(sj["runs"].size() == 11);  // none + 2 policies x 5 budgets
    REQUIRE(sj["runs"][1]["budget"] == 51);
    REQUIRE(sj["runs"][1]["streams"] == 2);
  }
  SECTION("bad study flags exit 2 naming the flag") {
    RunResult bad = RunKvserve(absl::StrCat(BaseArgs(), " --policy lru"), true);
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.out.find("--policy \"lru\" is not a policy") != std::string::npos);
    bad = RunKvserve(absl::StrCat(BaseArgs(), " --sweep 4"), true);
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.out.find("--sweep needs --policy") != std::string::npos);
  }
}

TEST_CASE("kvserve eval-kv --frontier: held-out points, the front, JSON and PNG",
          "[integration][frontier]") {
  // Calibration: the dev text's first 40 stories; held out: the rest.
  const std::string dir = testing::MakeTempDir("eval-kv-frontier");
  const std::string text = testing::ReadFileOrDie(DevText());
  size_t cut = 0;
  for (int k = 0; k < 40; ++k) cut = text.find("<|endoftext|>", cut) + 1;
  cut = text.find('\n', cut) + 1;
  std::ofstream(dir + "/calibration.txt", std::ios::binary) << text.substr(0, cut);
  std::ofstream(dir + "/heldout.txt", std::ios::binary) << text.substr(cut);
  const std::string args =
      absl::StrCat("eval-kv --model ", Quote(testing::Stories260kCheckpoint()), " --frontier",
                   " --calibration-text ", Quote(dir + "/calibration.txt"), " --text ",
                   Quote(dir + "/heldout.txt"));
  RunResult r = RunKvserve(absl::StrCat(args, " --streams 3 --kv-dtype int8 --kv-dtype int4_kc",
                                        " --policy streaming,learned --json ",
                                        Quote(dir + "/f.json"), " --png ", Quote(dir + "/f.png")),
                           /*both_streams=*/true);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("3 streams of 256 tokens") != std::string::npos);
  REQUIRE(r.out.find("training the learned evictor on") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFileOrDie(dir + "/f.json"));
  // fp32 and int8, each dense and 2 policies x 4 budgets; int4_kc dense;
  // low-rank at 75% and 50% in fp32, fp16 and int8 pages; cross-layer from
  // layer 2 at thresholds 0.3 and 0.7 in fp32 and int8 pages.
  REQUIRE(j["points"].size() == 29);
  REQUIRE(j["reference"]["kv_dtype"] == "fp32");
  REQUIRE(j["fp16_bytes_per_token"] == 640);
  REQUIRE(j["stream_tokens"] == 256);
  int front = 0;
  for (const auto& p : j["points"]) {
    for (const char* key : {"name", "kv_dtype", "low_rank", "cross_layer", "policy", "budget",
                            "bytes_per_token", "ppl", "delta_ppl_pct"}) {
      REQUIRE(p.contains(key));
    }
    front += p["pareto"].get<bool>() ? 1 : 0;
  }
  REQUIRE(front >= 2);
  REQUIRE(j["points"][0]["name"] == "fp32");
  REQUIRE(j["points"][0]["delta_ppl_pct"] == 0);
  REQUIRE(j["points"][1]["name"] == "fp32 @ streaming 20%");
  REQUIRE(j["points"][1]["budget"] == 51);
  REQUIRE(j["points"][18]["kv_dtype"] == "int4_kc");
  REQUIRE(j["points"][18]["bytes_per_token"] == 280);
  // int8 latents of rank 16 of 32: 5 layers x (32 codes + 8 scale bytes).
  REQUIRE(j["points"][24]["name"] == "int8+lr50%");
  REQUIRE(j["points"][24]["low_rank"] == 0.5);
  REQUIRE(j["points"][24]["bytes_per_token"] == 200);
  REQUIRE(j["points"][24]["budget"].is_null());
  REQUIRE(j["points"][19]["low_rank"] == 0.75);
  REQUIRE(j["points"][25]["name"] == "fp32+xl2@0.3");
  REQUIRE(j["points"][25]["cross_layer"] == 2);
  REQUIRE(j["points"][25]["bytes_per_token"] == 1076);
  REQUIRE(j["points"][28]["name"] == "int8+xl2@0.7");
  REQUIRE(j["points"][28]["bytes_per_token"] == 416);
  REQUIRE(j["points"][24]["cross_layer"].is_null());
  REQUIRE(r.out.find("calibrating low-rank KV at rank 24 of 32") != std::string::npos);
  REQUIRE(testing::ReadFileOrDie(dir + "/f.png").substr(1, 3) == "PNG");

  SECTION("--frontier needs --calibration-text") {
    RunResult bad =
        RunKvserve(absl::StrCat("eval-kv --model ", Quote(testing::Stories260kCheckpoint()),
                                " --frontier --text ", Quote(DevText())),
                   true);
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.out.find("--frontier needs --calibration-text") != std::string::npos);
  }
}

TEST_CASE("kvserve train-evictor writes a model eval-kv and the engine load",
          "[integration][eviction]") {
  const std::string dir = testing::MakeTempDir("train-evictor");
  RunResult r = RunKvserve(
      absl::StrCat("train-evictor --model ", Quote(testing::Stories260kCheckpoint()), " --text ",
                   Quote(DevText()), " --streams 2 --out ", Quote(dir + "/evictor.txt")));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("trained on ") == 0);
  const std::string model = testing::ReadFileOrDie(dir + "/evictor.txt");
  REQUIRE(model.rfind("kvserve-evictor 1\n", 0) == 0);
  RunResult e = RunKvserve(absl::StrCat(BaseArgs(),
                                        " --policy learned --budget 64 --stream-tokens 300"
                                        " --recompute no --evictor-model ",
                                        Quote(dir + "/evictor.txt")));
  REQUIRE(e.exit_code == 0);
  REQUIRE_FALSE(TableRow(e.out, "learned").empty());
  RunResult missing = RunKvserve("train-evictor --model x --text y", true);
  REQUIRE(missing.exit_code == 2);
  REQUIRE(missing.out.find("--out is required") != std::string::npos);
}

}  // namespace
}  // namespace kvserve
