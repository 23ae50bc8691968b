// The tiers below the device pool, end to end on stories260K: a pool too
// small for the working set spills filed prefix blocks to the host tier
// (or the disk tier), and a prompt coming back is served from there with
// exactly the greedy tokens it had when computed.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cache/format/kv_dtype_spec.h"
#include "model/cpu/cpu_model_runner.h"
#include "scheduler/engine.h"
#include "scheduler/engine_tiers.h"
#include "tests/engine_harness.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::DevStories;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunOne;
using testing::Stories;

constexpr int kHost = static_cast<int>(TierKind::kHost);
constexpr int kDisk = static_cast<int>(TierKind::kDisk);
constexpr int kDevice = static_cast<int>(TierKind::kDevice);

KvTierConfig HostOnly(int64_t bytes) {
  KvTierConfig c;
  c.host_bytes = bytes;
  return c;
}

std::unique_ptr<Engine> MakeTierEngine(const KvTierConfig& tiers, KvDtype dtype,
                                       const std::string& fingerprint = "stories") {
  testing::EngineSetup s;
  s.num_blocks = 40;  // 32 for one max_model_len sequence, too few for four prompts
  CpuRunnerOptions opt;
  opt.kv_dtype = dtype;
  opt.block_size = s.block_size;
  opt.num_blocks = s.num_blocks;
  opt.num_tail_blocks = 2 * s.max_num_seqs;
  auto runner = CpuModelRunner::Create(Stories().weights, opt);
  REQUIRE(runner.ok());
  EngineConfig config = testing::EngineConfigOf(s);
  config.tiers = tiers;
  config.weights_fingerprint = fingerprint;
  auto engine = Engine::Create(config, std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  return std::move(*engine);
}

TEST_CASE("The tier identity keys every layer's format, not layer 0's alone", "[scheduler]") {
  const int layers = Stories().weights.config.num_layers;
  REQUIRE(layers >= 3);
  // a: int8, int4, int8, int8, ...; b: layers 1 and 2 swapped: the same
  // layer 0 and the same bytes per block, other bytes in other places.
  std::vector<std::string> a_list(layers, "int8"), b_list(layers, "int8");
  a_list[1] = "int4";
  b_list[2] = "int4";
  auto runner_for = [](const std::vector<std::string>& list) {
    CpuRunnerOptions opt;
    absl::StatusOr<KvDtypeSpec> spec = KvDtypeSpec::Parse(absl::StrJoin(list, ","));
    REQUIRE(spec.ok());
    opt.kv_dtype = *spec;
    opt.block_size = 16;
    opt.num_blocks = 40;
    auto runner = CpuModelRunner::Create(Stories().weights, opt);
    REQUIRE(runner.ok());
    return std::move(*runner);
  };
  const auto a = runner_for(a_list), b = runner_for(b_list), a2 = runner_for(a_list);
  REQUIRE(a->tier_block_bytes() == b->tier_block_bytes());
  REQUIRE(a->kv_format().dtype() == b->kv_format().dtype());
  const TierIdentity ia = TierIdentityOf(*a, "w"), ib = TierIdentityOf(*b, "w");
  REQUIRE(ia.payload_bytes == ib.payload_bytes);
  REQUIRE(ia.kv_format != ib.kv_format);
  REQUIRE_FALSE(ia == ib);
  REQUIRE(TierIdentityOf(*a2, "w") == ia);
  REQUIRE_FALSE(TierIdentityOf(*a, "other weights") == ia);
}

// Prompt i: 200 tokens of dev story i (12 full blocks before its last token).
GenerateRequest Prompt(int i, const std::string& salt = "") {
  std::vector<int32_t> ids = Stories().tokenizer->Encode(DevStories()[i], true);
  REQUIRE(ids.size() >= 200);
  ids.resize(200);
  GenerateRequest r;
  r.prompt_token_ids = ids;
  r.max_tokens = 24;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  r.cache_salt = salt;
  return r;
}

// Runs prompts 0..3 one after another: 4 x 14 blocks through a 40-block
// pool evicts every block of prompt 0 from the device.
std::vector<Result> FillPool(Engine& engine, const std::string& salt = "") {
  std::vector<Result> out;
  for (int i = 0; i < 4; ++i) out.push_back(RunOne(engine, Prompt(i, salt)));
  return out;
}

TEST_CASE(
    "Prompts evicted from a small device pool come back from the host tier with the same "
    "greedy tokens",
    "[scheduler][tier]") {
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kInt8, KvDtype::kInt4Kc}) {
    INFO("kv dtype " << KvDtypeName(dtype));
    auto engine = MakeTierEngine(HostOnly(8 << 20), dtype);
    const std::vector<Result> first = FillPool(*engine);
    REQUIRE(engine->GetStats().tiers[kHost].hit_blocks == 0);
    REQUIRE(engine->GetStats().tiers[kHost].stored_tokens > 0);
    const Result again = RunOne(*engine, Prompt(0));
    REQUIRE(again.tokens == first[0].tokens);
    REQUIRE(again.usage.cached_prompt_tokens == 192);
    const EngineStats st = engine->GetStats();
    REQUIRE(st.tiers_enabled);
    REQUIRE(st.tiers[kHost].hit_blocks == 12);
    REQUIRE(st.tiers[kHost].loaded_tokens == 192);
    REQUIRE(st.kv.tier_hit_tokens == 192);
    REQUIRE(st.tiers[kHost].rejects == std::array<int64_t, kNumTierRejects>{});
    REQUIRE(st.tiers[kHost].bytes_used > 0);
    REQUIRE(st.tiers[kHost].bytes_used <= 8 << 20);
    REQUIRE(st.tiers[kDevice].hit_blocks == 0);
    // The rest of the pool's history came back too: prompt 1, then 0 again
    // from the device.
    REQUIRE(RunOne(*engine, Prompt(1)).tokens == first[1].tokens);
    REQUIRE(RunOne(*engine, Prompt(0)).tokens == first[0].tokens);
    RequireAllBlocksFree(*engine);
  }
}

TEST_CASE("Without a host tier the same prompts are recomputed with the same tokens",
          "[scheduler][tier]") {
  auto engine = MakeTierEngine({}, KvDtype::kFp32);
  const std::vector<Result> first = FillPool(*engine);
  const Result again = RunOne(*engine, Prompt(0));
  REQUIRE(again.tokens == first[0].tokens);
  REQUIRE(again.usage.cached_prompt_tokens == 0);
  REQUIRE_FALSE(engine->GetStats().tiers_enabled);
  RequireAllBlocksFree(*engine);
}

TEST_CASE("Another cache salt finds nothing in the host tier", "[scheduler][tier]") {
  auto engine = MakeTierEngine(HostOnly(8 << 20), KvDtype::kFp32);
  const std::vector<Result> first = FillPool(*engine, "tenant-a");
  const Result other = RunOne(*engine, Prompt(0, "tenant-b"));
  REQUIRE(other.tokens == first[0].tokens);
  REQUIRE(other.usage.cached_prompt_tokens == 0);
  REQUIRE(engine->GetStats().tiers[kHost].hit_blocks == 0);
  const Result same = RunOne(*engine, Prompt(0, "tenant-a"));
  REQUIRE(same.usage.cached_prompt_tokens == 192);
  REQUIRE(engine->GetStats().tiers[kHost].hit_blocks == 12);
  RequireAllBlocksFree(*engine);
}

TEST_CASE("The disk tier serves a restarted engine warm with the same tokens",
          "[scheduler][tier]") {
  const std::string path = testing::MakeTempDir("engine_tier") + "/kv.tier";
  KvTierConfig disk;
  disk.disk_path = path;
  disk.disk_bytes = 4 << 20;
  std::vector<Result> first;
  {
    auto engine = MakeTierEngine(disk, KvDtype::kInt8);
    first = FillPool(*engine);
    REQUIRE(engine->GetStats().tiers[kDisk].stored_tokens > 0);
  }
  SECTION("restarted: prompt 0 comes from the disk") {
    auto engine = MakeTierEngine(disk, KvDtype::kInt8);
    const Result again = RunOne(*engine, Prompt(0));
    REQUIRE(again.tokens == first[0].tokens);
    REQUIRE(again.usage.cached_prompt_tokens == 192);
    const EngineStats st = engine->GetStats();
    REQUIRE(st.tiers[kDisk].hit_blocks == 12);
    // One background read of the 12 blocks (tier_prefetch.h), none in the step.
    REQUIRE(st.tiers[kDisk].load_count == 1);
    REQUIRE(st.tiers[kDisk].load_timeouts == 0);
    REQUIRE(st.num_tier_loading == 0);
    RequireAllBlocksFree(*engine);
  }
  SECTION("another model's engine reads nothing of the file") {
    auto engine = MakeTierEngine(disk, KvDtype::kInt8, "other-weights");
    const Result again = RunOne(*engine, Prompt(0));
    REQUIRE(again.tokens == first[0].tokens);
    REQUIRE(again.usage.cached_prompt_tokens == 0);
    REQUIRE(engine->GetStats().tiers[kDisk].hit_blocks == 0);
    RequireAllBlocksFree(*engine);
  }
  SECTION("another KV format's engine reads nothing of the file") {
    auto engine = MakeTierEngine(disk, KvDtype::kFp16);
    REQUIRE(RunOne(*engine, Prompt(0)).usage.cached_prompt_tokens == 0);
    REQUIRE(engine->GetStats().tiers[kDisk].hit_blocks == 0);
  }
}

TEST_CASE("Tier settings are checked at engine creation naming the key", "[scheduler][tier]") {
  CpuRunnerOptions opt;
  opt.num_blocks = 40;
  auto runner = CpuModelRunner::Create(Stories().weights, opt);
  REQUIRE(runner.ok());
  EngineConfig config = testing::EngineConfigOf({});
  config.tiers.disk_path = testing::MakeTempDir("engine_tier") + "/kv.tier";
  auto engine = Engine::Create(config, std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(engine.status().message()) ==
          "cache.disk_tier_bytes must be set with cache.disk_tier_path");
}

}  // namespace
}  // namespace kvserve
