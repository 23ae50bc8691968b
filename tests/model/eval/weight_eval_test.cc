// eval-kv's weight-dtype report (model/eval/kv_eval.h with weight_dtypes) on
// stories260K and the dev text: one row per weight dtype after the fp32
// reference, the perplexity bound for int8 weights, the measured
// int4 loss pinned, and the JSON's weight_dtype and ppl keys.
#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/cpu/cpu_model_runner.h"
#include "model/eval/kv_eval.h"
#include "model/loader/llama2c_loader.h"
#include "model/loader/quantize_weights.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

TEST_CASE("eval-kv by weight dtype: int8 within 0.5% ppl of fp32 weights on the dev text",
          "[model]") {
  absl::StatusOr<LlamaWeights> w = LoadLlama2cCheckpoint(testing::Stories260kCheckpoint());
  REQUIRE(w.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
  REQUIRE(tok.ok());
  const std::vector<std::vector<int32_t>> stories = TokenizeStories(
      testing::ReadFileOrDie(testing::SharedDir() + "/data/tinystories_valid_dev.txt"), **tok, 512,
      /*max_stories=*/30);
  KvQualityOptions opt;
  opt.weight_dtypes = {"int8", "int4", "int4_asym"};
  opt.num_prompts = 4;
  opt.continuation = 32;
  std::vector<std::string> made;
  opt.make_weight_runner =
      [&](const std::string& name) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    made.push_back(name);
    LlamaWeights q = *w;
    if (name != "fp32") {
      absl::StatusOr<WeightQuantSpec> spec = ParseWeightQuant(name);
      if (!spec.ok()) return spec.status();
      if (absl::Status s = QuantizeWeights(*spec, &q); !s.ok()) return s;
    }
    auto r = CpuModelRunner::Create(std::move(q), CpuRunnerOptions{});
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };
  absl::StatusOr<KvQualityReport> rep = EvaluateKvQuality(
      stories,
      [](const KvDtypeSpec&) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        return absl::InternalError("the KV factory is not used for weight dtypes");
      },
      opt);
  REQUIRE(rep.ok());
  REQUIRE(made == std::vector<std::string>{"fp32", "int8", "int4", "int4_asym"});
  REQUIRE(rep->formats.size() == 4);
  const KvFormatQuality& fp32 = rep->formats[0];
  const KvFormatQuality& int8 = rep->formats[1];
  const KvFormatQuality& int4 = rep->formats[2];
  const KvFormatQuality& int4_asym = rep->formats[3];
  REQUIRE(fp32.weight_dtype == "fp32");
  REQUIRE(int8.weight_dtype == "int8");
  REQUIRE(int4.weight_dtype == "int4");
  REQUIRE(int4_asym.weight_dtype == "int4_asym");
  REQUIRE(fp32.delta_ppl_percent == 0.0);
  std::printf(
      "stories260K, 30 dev stories: ppl fp32 %.4f, int8 %.4f (%+.3f%%), int4 %.4f (%+.3f%%), "
      "int4_asym %.4f (%+.3f%%)\n",
      fp32.perplexity, int8.perplexity, int8.delta_ppl_percent, int4.perplexity,
      int4.delta_ppl_percent, int4_asym.perplexity, int4_asym.delta_ppl_percent);
  REQUIRE(std::abs(int8.delta_ppl_percent) <= 0.5);
  REQUIRE(int8.top1_agreement > 0.97);
  // int4 misses the 3% here (stories260K's 64-wide rows; see
  // docs/benchmarks.md): the group-32 scale search measures +8.5% on these
  // 30 stories (+8.0% on all 89); this bound lets a regression show.
  REQUIRE(int4.delta_ppl_percent > 0.0);
  REQUIRE(int4.delta_ppl_percent <= 12.0);
  // int4_asym (a per-group offset, 0.5 bits a weight more) still misses 3%
  // but must keep most of its lead over int4: +5.3% on these stories.
  REQUIRE(int4_asym.delta_ppl_percent > 0.0);
  REQUIRE(int4_asym.delta_ppl_percent <= 8.0);
  REQUIRE(int4_asym.delta_ppl_percent < int4.delta_ppl_percent);
  const nlohmann::json j = nlohmann::json::parse(KvQualityJson(*rep));
  REQUIRE(j["formats"].size() == 4);
  REQUIRE(j["formats"][1]["weight_dtype"] == "int8");
  REQUIRE(j["formats"][1]["ppl"].get<double>() == int8.perplexity);
  REQUIRE(KvQualityTable(*rep).find("weights") == 0);
}

}  // namespace
}  // namespace kvserve
