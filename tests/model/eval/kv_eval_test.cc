// The KV cache quality report on stories260K and the TinyStories dev text:
// how stories are cut and tokenized, the perplexity bounds per KV
// format (teacher forcing through each format's paged cache), KL and top-1
// sanity, exact KV bytes per token, invariance to the prefill chunk and the
// block size, greedy decoding with int8 and int4_kc caches against
// llama2.c's reference text, and the errors for bad input.
#include "model/eval/kv_eval.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/cpu_model_runner.h"
#include "model/loader/llama2c_loader.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/stories260k.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Stories260k;
using testing::Stories260kTok;

std::string DevText() {
  return testing::ReadFileOrDie(testing::SharedDir() + "/data/tinystories_valid_dev.txt");
}

const std::vector<std::vector<int32_t>>& DevStories() {
  static const auto* s = new std::vector<std::vector<int32_t>>(
      TokenizeStories(DevText(), Stories260kTok(), /*max_tokens=*/512));
  return *s;
}

KvRunnerFactory Factory(int block_size = 16) {
  return [block_size](const KvDtypeSpec& dtype) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
    CpuRunnerOptions opt;
    opt.kv_dtype = dtype;
    opt.block_size = block_size;
    auto r = CpuModelRunner::Create(Stories260k(), opt);
    if (!r.ok()) return r.status();
    return std::unique_ptr<ModelRunner>(std::move(*r));
  };
}

std::unique_ptr<ModelRunner> MakeRunner(const KvDtypeSpec& dtype) {
  auto r = Factory()(dtype);
  REQUIRE(r.ok());
  return std::move(*r);
}

// int4_kc with int8 in the first and the last layer.
KvDtypeSpec Mix() { return *KvDtypeSpec::Parse("int8,int4_kc*,int8"); }

// Every format over the whole dev text, computed once for the test cases below.
const KvQualityReport& FullReport() {
  static const KvQualityReport* report = [] {
    KvQualityOptions opt;
    opt.dtypes.assign(std::begin(kCpuKvDtypes), std::end(kCpuKvDtypes));
    opt.dtypes.push_back(Mix());
    opt.num_prompts = 8;
    opt.continuation = 64;
    auto r = EvaluateKvQuality(DevStories(), Factory(), opt);
    if (!r.ok()) FAIL(std::string(r.status().message()));
    return new KvQualityReport(std::move(*r));
  }();
  return *report;
}

const KvFormatQuality& Row(const KvDtypeSpec& dtype) {
  const KvFormatQuality* q = FullReport().Find(dtype);
  REQUIRE(q != nullptr);
  return *q;
}

TEST_CASE("TokenizeStories cuts the text at <|endoftext|> lines", "[model]") {
  const Tokenizer& tok = Stories260kTok();
  SECTION("each story is BOS + its stripped text; empty stories are dropped") {
    const std::string text =
        "Tom had a dog.\nThe dog ran.\n<|endoftext|>\n\n  \n<|endoftext|>\n  Sue sat. \n";
    const auto stories = TokenizeStories(text, tok, 512);
    REQUIRE(stories.size() == 2);
    REQUIRE(stories[0] == tok.Encode("Tom had a dog.\nThe dog ran.", true));
    REQUIRE(stories[1] == tok.Encode("Sue sat.", true));
  }
  SECTION("stories are truncated to max_tokens and counted up to max_stories") {
    const std::string text = "Once upon a time there was a cat.\n<|endoftext|>\nA dog.\n";
    const auto stories = TokenizeStories(text, tok, 4, 1);
    REQUIRE(stories.size() == 1);
    REQUIRE(stories[0].size() == 4);
    REQUIRE(stories[0][0] == tok.bos_id());
  }
  SECTION("the dev text holds 89 stories, each within the model's 512 positions") {
    const auto& stories = DevStories();
    REQUIRE(stories.size() == 89);
    for (const auto& s : stories) {
      REQUIRE(s.size() >= 2);
      REQUIRE(s.size() <= 512);
      REQUIRE(s[0] == tok.bos_id());
    }
    REQUIRE(TokenizeStories(DevText(), tok, 512, 20).size() == 20);
  }
}

TEST_CASE("quantized KV formats keep perplexity on the dev text within the issue's bounds",
          "[model]") {
  const KvQualityReport& report = FullReport();
  int64_t predictions = 0;
  for (const auto& s : DevStories()) predictions += static_cast<int64_t>(s.size()) - 1;
  REQUIRE(report.num_stories == 89);
  REQUIRE(report.num_predictions == predictions);
  REQUIRE(report.formats.size() == 10);
  REQUIRE(report.formats[0].dtype == KvDtype::kFp32);

  SECTION("the fp32 reference has a sane perplexity and agrees with itself exactly") {
    const KvFormatQuality& fp32 = Row(KvDtype::kFp32);
    INFO("fp32 ppl " << fp32.perplexity);
    REQUIRE(fp32.perplexity > 1.5);
    REQUIRE(fp32.perplexity < 10.0);
    REQUIRE(fp32.delta_ppl_percent == 0.0);
    REQUIRE(fp32.mean_kl == 0.0);
    REQUIRE(fp32.top1_agreement == 1.0);
    REQUIRE(fp32.greedy_full_match == 1.0);
  }
  SECTION("perplexity increase: <= 0.5% int8, 1% fp8/fp16/bf16/k8v4, 3% int4_kc and its mix") {
    struct Bound {
      KvDtypeSpec dtype;
      double max_percent;
    };
    // int4 is not in this list: see the next section.
    for (Bound b : {Bound{KvDtype::kInt8, 0.5}, Bound{KvDtype::kFp8E4m3, 1.0},
                    Bound{KvDtype::kFp16, 1.0}, Bound{KvDtype::kBf16, 1.0},
                    Bound{KvDtype::kK8V4, 1.0}, Bound{KvDtype::kInt4Kc, 3.0}, Bound{Mix(), 3.0},
                    // int2_kc measures +14.4% (min-max rounding; K's 2 bits are
                    // what costs it: with 4-bit V it is +12.7%, with 4-bit K +0.9%).
                    Bound{KvDtype::kInt2Kc, 16.0}}) {
      const KvFormatQuality& q = Row(b.dtype);
      INFO(b.dtype.ToString() << ": ppl " << q.perplexity << " vs fp32 "
                              << Row(KvDtype::kFp32).perplexity << ", +" << q.delta_ppl_percent
                              << "%, bound " << b.max_percent << "%");
      CHECK(q.delta_ppl_percent <= b.max_percent);
    }
  }
  SECTION("int4 stays within its measured loss; int4_kc is what meets 3% in fewer bytes") {
    // stories260K has head_dim 8, so the int4 group is the whole head, and one
    // low-frequency RoPE pair of K is ~10x the other channels: 16 levels per
    // token wipe out the small ones (+43%; int4 on V alone costs +0.14%).
    // int4_kc quantizes K per channel over a block (each channel on its own
    // range) and keeps a row's own block in full precision: 270 bytes per
    // token against int4's 320, at about k8v4's quality.
    const KvFormatQuality& q = Row(KvDtype::kInt4);
    const KvFormatQuality& kc = Row(KvDtype::kInt4Kc);
    INFO("int4 +" << q.delta_ppl_percent << "%, int4_kc +" << kc.delta_ppl_percent << "%");
    REQUIRE(q.delta_ppl_percent <= 45.0);
    REQUIRE(kc.delta_ppl_percent * 20 < q.delta_ppl_percent);
    REQUIRE(kc.bytes_per_token < q.bytes_per_token);
    REQUIRE(kc.mean_kl < q.mean_kl / 20);
    WARN("int4_kc: ppl " << kc.perplexity << " (+" << kc.delta_ppl_percent
                         << "% over fp32), mean greedy agreement " << kc.mean_greedy_agreement
                         << " tokens; int8,int4_kc*,int8: +" << Row(Mix()).delta_ppl_percent
                         << "%, " << Row(Mix()).mean_greedy_agreement << " tokens");
  }
  SECTION("KL and top-1 agreement: fp16 is nearly exact, bf16 and int8 close") {
    const KvFormatQuality& fp16 = Row(KvDtype::kFp16);
    const KvFormatQuality& bf16 = Row(KvDtype::kBf16);
    const KvFormatQuality& int8 = Row(KvDtype::kInt8);
    INFO("KL fp16 " << fp16.mean_kl << ", bf16 " << bf16.mean_kl << ", int8 " << int8.mean_kl);
    REQUIRE(fp16.mean_kl < 1e-5);
    REQUIRE(fp16.top1_agreement > 0.999);
    REQUIRE(std::fabs(fp16.delta_ppl_percent) < 0.01);
    REQUIRE(bf16.mean_kl < 1e-3);
    REQUIRE(bf16.top1_agreement > 0.99);
    REQUIRE(int8.mean_kl < 1e-2);
    REQUIRE(int8.top1_agreement > 0.97);
    // More bits, less divergence.
    REQUIRE(fp16.mean_kl < bf16.mean_kl);
    REQUIRE(bf16.mean_kl < int8.mean_kl);
    REQUIRE(Row(KvDtype::kK8V4).mean_kl < Row(KvDtype::kInt4).mean_kl);
    REQUIRE(Row(Mix()).mean_kl < Row(KvDtype::kInt4Kc).mean_kl);
    for (const KvFormatQuality& q : report.formats) {
      INFO(q.dtype.ToString());
      REQUIRE(q.mean_kl >= 0.0);
      REQUIRE(q.max_kl >= q.mean_kl);
      REQUIRE(q.top1_agreement > 0.5);
      REQUIRE(q.top1_agreement <= 1.0);
      REQUIRE(q.mean_greedy_agreement >= 0.0);
      REQUIRE(q.mean_greedy_agreement <= Row(KvDtype::kFp32).mean_greedy_agreement);
    }
  }
  SECTION("KV bytes per token over the 5 layers (4 kv heads x head_dim 8), scales included") {
    struct Bytes {
      KvDtypeSpec dtype;
      int64_t bytes;
    };
    // fp32: 5 x 2 x 4 x 8 x 4 bytes; int8/fp8 add a 4-byte scale per head per token;
    // int4 (group clamped to 8): 4 data bytes + fp16 scale and zero per head per token;
    // int4_kc: int4 with K's scales per channel per block: (8 + 2 x 8) / 16 = 1.5 bytes
    // per head per token instead of 4 (54 a layer), as allocated 56 (a block's 864
    // bytes padded to 896); the mix: 2 int8 layers + 3 int4_kc layers.
    for (Bytes b :
         {Bytes{KvDtype::kFp32, 1280}, Bytes{KvDtype::kFp16, 640}, Bytes{KvDtype::kBf16, 640},
          Bytes{KvDtype::kFp8E4m3, 480}, Bytes{KvDtype::kInt8, 480}, Bytes{KvDtype::kInt4, 320},
          Bytes{KvDtype::kK8V4, 400}, Bytes{KvDtype::kInt4Kc, 280},
          // int2_kc: 2-bit codes with int4_kc's meta, 608 bytes a block padded to 640.
          Bytes{KvDtype::kInt2Kc, 200}, Bytes{Mix(), 2 * 96 + 3 * 56}}) {
      INFO(b.dtype.ToString());
      REQUIRE(Row(b.dtype).bytes_per_token == b.bytes);
      REQUIRE(Row(b.dtype).bytes_vs_fp16 == b.bytes / 640.0);
    }
    REQUIRE(report.int4_group_size == 8);
    REQUIRE(report.block_size == 16);
  }
}

TEST_CASE("with an int4_kc KV cache greedy decoding from BOS follows the reference text",
          "[model]") {
  const Tokenizer& tok = Stories260kTok();
  const std::vector<int32_t> bos = {tok.bos_id()};
  auto fp32 = MakeRunner(KvDtype::kFp32);
  auto kc = MakeRunner(KvDtype::kInt4Kc);
  auto mix = MakeRunner(Mix());
  auto ref = GreedyDecode(*fp32, bos, 256, /*stop_at_stop_tokens=*/true);
  REQUIRE(ref.ok());
  REQUIRE(tok.Decode(*ref, tok.bos_id()) == testing::GoldenGreedyText());
  auto common = [&](const std::vector<int32_t>& out) {
    size_t n = 0;
    while (n < std::min(ref->size(), out.size()) && (*ref)[n] == out[n]) ++n;
    return n;
  };
  auto out = GreedyDecode(*kc, bos, 256, /*stop_at_stop_tokens=*/true);
  auto out_mix = GreedyDecode(*mix, bos, 256, /*stop_at_stop_tokens=*/true);
  REQUIRE(out.ok());
  REQUIRE(out_mix.ok());
  const size_t n = common(*out), n_mix = common(*out_mix);
  WARN("golden_greedy_256.txt: int4_kc matches the first " << n << " tokens, int8,int4_kc*,int8 "
                                                           << n_mix << " (int8: 118)");
  // Measured: 96 for both; int8 matches 118.
  REQUIRE(n >= 90);
  REQUIRE(n_mix >= 90);
  const std::string golden_prefix =
      tok.Decode(std::span<const int32_t>(ref->data(), n), tok.bos_id());
  REQUIRE(testing::GoldenGreedyText().rfind(golden_prefix, 0) == 0);
  REQUIRE(tok.Decode(*out, tok.bos_id()).rfind(golden_prefix, 0) == 0);
}

TEST_CASE("with an int8 KV cache greedy decoding from BOS follows the reference text", "[model]") {
  const Tokenizer& tok = Stories260kTok();
  const std::vector<int32_t> bos = {tok.bos_id()};
  auto fp32 = MakeRunner(KvDtype::kFp32);
  auto int8 = MakeRunner(KvDtype::kInt8);
  auto ref = GreedyDecode(*fp32, bos, 256, /*stop_at_stop_tokens=*/true);
  auto out = GreedyDecode(*int8, bos, 256, /*stop_at_stop_tokens=*/true);
  REQUIRE(ref.ok());
  REQUIRE(out.ok());
  SECTION("the fp32 cache reproduces golden_greedy_256.txt: 256 tokens") {
    REQUIRE(ref->size() == 256);
    REQUIRE(tok.Decode(*ref, tok.bos_id()) == testing::GoldenGreedyText());
  }
  SECTION("the int8 cache matches it for at least the first 100 tokens") {
    size_t common = 0;
    while (common < std::min(ref->size(), out->size()) && (*ref)[common] == (*out)[common]) {
      ++common;
    }
    INFO("int8 agrees with fp32 for " << common << " tokens");
    REQUIRE(common >= 100);
    const std::string golden_prefix =
        tok.Decode(std::span<const int32_t>(ref->data(), 100), tok.bos_id());
    REQUIRE(testing::GoldenGreedyText().rfind(golden_prefix, 0) == 0);
    REQUIRE(tok.Decode(*out, tok.bos_id()).rfind(golden_prefix, 0) == 0);
  }
  SECTION("without stop tokens decoding runs on to the requested length") {
    auto more = GreedyDecode(*fp32, bos, 400, /*stop_at_stop_tokens=*/false);
    REQUIRE(more.ok());
    REQUIRE(more->size() == 400);
    // BOS (token 346 of the story) ends it when stop tokens count.
    auto stopped = GreedyDecode(*fp32, bos, 400, /*stop_at_stop_tokens=*/true);
    REQUIRE(stopped.ok());
    REQUIRE(stopped->size() == 346);
    REQUIRE(stopped->back() == tok.bos_id());
    REQUIRE(std::equal(stopped->begin(), stopped->end(), more->begin()));
  }
}

TEST_CASE("the report does not depend on the prefill chunk or the block size", "[model]") {
  const std::vector<std::vector<int32_t>> stories(DevStories().begin(), DevStories().begin() + 4);
  KvQualityOptions opt;
  opt.dtypes = {KvDtype::kInt8, KvDtype::kFp32, KvDtype::kInt8, KvDtype::kK8V4, KvDtype::kInt4Kc};
  opt.num_prompts = 2;
  opt.continuation = 16;
  opt.chunk_tokens = 64;
  auto base = EvaluateKvQuality(stories, Factory(16), opt);
  REQUIRE(base.ok());
  SECTION("fp32 comes first and duplicates are dropped") {
    REQUIRE(base->formats.size() == 4);
    REQUIRE(base->formats[0].dtype == KvDtype::kFp32);
    REQUIRE(base->formats[1].dtype == KvDtype::kInt8);
    REQUIRE(base->formats[2].dtype == KvDtype::kK8V4);
    REQUIRE(base->formats[3].dtype == KvDtype::kInt4Kc);
    REQUIRE(base->num_prompts == 2);
  }
  SECTION("one row per step, odd chunks and block sizes 1 and 64 give the same numbers") {
    // The chunking leaves every row's arithmetic as it is. Another block size
    // changes how attention walks the keys, so float rounding moves by an
    // ulp, and in a quantized cache such a move now and then flips a value
    // to the next level in a later layer: close, not bit-equal.
    struct Variant {
      int32_t chunk;
      int block_size;
      double ppl_rel;
      double kl_rel;
    };
    // int4_kc is chunk-invariant too (a row sees its own block in full
    // precision whatever the steps); its block size is part of its format
    // (K ranges span a block), so it is compared at 16 only.
    for (Variant v : {Variant{1, 16, 1e-9, 1e-6}, Variant{37, 16, 1e-9, 1e-6},
                      Variant{64, 1, 5e-4, 2e-2}, Variant{37, 64, 5e-4, 2e-2}}) {
      KvQualityOptions o = opt;
      o.chunk_tokens = v.chunk;
      if (v.block_size != 16) o.dtypes.pop_back();
      auto r = EvaluateKvQuality(stories, Factory(v.block_size), o);
      REQUIRE(r.ok());
      REQUIRE(r->formats.size() == base->formats.size() - (v.block_size != 16 ? 1 : 0));
      for (size_t f = 0; f < r->formats.size(); ++f) {
        const KvFormatQuality& a = base->formats[f];
        const KvFormatQuality& b = r->formats[f];
        INFO("chunk " << v.chunk << ", block size " << v.block_size << ", " << a.dtype.ToString());
        REQUIRE(b.perplexity == Approx(a.perplexity).epsilon(v.ppl_rel));
        REQUIRE(b.mean_kl == Approx(a.mean_kl).epsilon(v.kl_rel).margin(1e-12));
        REQUIRE(std::fabs(b.top1_agreement - a.top1_agreement) < 2e-3);
      }
    }
  }
}

TEST_CASE("EvaluateKvQuality rejects unusable input", "[model]") {
  const std::vector<std::vector<int32_t>> stories(DevStories().begin(), DevStories().begin() + 1);
  KvQualityOptions opt;
  opt.dtypes = {KvDtype::kInt8};
  SECTION("a chunk of 0 rows") {
    opt.chunk_tokens = 0;
    auto r = EvaluateKvQuality(stories, Factory(), opt);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(r.status().message()).find("chunk_tokens") != std::string::npos);
  }
  SECTION("no story with two tokens") {
    auto r = EvaluateKvQuality({{1}, {}}, Factory(), opt);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a story longer than the model's context") {
    auto r = EvaluateKvQuality({std::vector<int32_t>(513, 5)}, Factory(), opt);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(r.status().message()).find("512") != std::string::npos);
  }
  SECTION("a token outside the vocabulary") {
    auto r = EvaluateKvQuality({{1, 600}}, Factory(), opt);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a runner that cannot be made") {
    KvRunnerFactory broken =
        [](const KvDtypeSpec&) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
      return absl::UnavailableError("no device");
    };
    auto r = EvaluateKvQuality(stories, broken, opt);
    REQUIRE(r.status().code() == absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace kvserve
