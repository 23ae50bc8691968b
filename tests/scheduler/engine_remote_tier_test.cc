// Two engines (replicas) sharing one real redis-server as their remote KV
// tier: what A computed, B serves from Redis with A's exact greedy tokens;
// Redis killed or stalled means recompute with the same tokens, never an
// error; another cache salt (tenant) never gets A's blocks. Through a proxy
// that holds Redis's replies (a slow Redis): other requests step while one
// waits for its load, a load past the timeout is recomputed and counted, and
// a request cancelled while waiting leaves every block in the pool.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/cpu/cpu_model_runner.h"
#include "scheduler/engine.h"
#include "tests/cache/tier/redis_fixture.h"
#include "tests/engine_harness.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using testing::Collect;
using testing::DevStories;
using testing::Eventually;
using testing::GatedProxy;
using testing::RedisServer;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunOne;
using testing::Stories;

constexpr int kRemote = static_cast<int>(TierKind::kRemote);

std::unique_ptr<Engine> MakeReplica(const std::string& url, int32_t timeout_ms = 2000) {
  testing::EngineSetup s;
  s.num_blocks = 40;
  CpuRunnerOptions opt;
  opt.kv_dtype = KvDtype::kInt8;
  opt.block_size = s.block_size;
  opt.num_blocks = s.num_blocks;
  auto runner = CpuModelRunner::Create(Stories().weights, opt);
  REQUIRE(runner.ok());
  EngineConfig config = testing::EngineConfigOf(s);
  config.tiers.remote_url = url;
  config.tiers.load_timeout_ms = timeout_ms;
  config.weights_fingerprint = "stories";
  auto engine = Engine::Create(config, std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  return std::move(*engine);
}

// Greedy, max_tokens tokens whatever comes, over `ids`.
GenerateRequest GreedyRequest(std::vector<int32_t> ids, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_token_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  return r;
}

// 300 tokens of dev story i: 18 full blocks before the last prompt token.
GenerateRequest LongPrompt(int i, const std::string& salt = "") {
  std::vector<int32_t> ids = Stories().tokenizer->Encode(DevStories()[i], true);
  std::vector<int32_t> more = Stories().tokenizer->Encode(DevStories()[i + 1], false);
  ids.insert(ids.end(), more.begin(), more.end());
  REQUIRE(ids.size() >= 300);
  ids.resize(300);
  GenerateRequest r = GreedyRequest(std::move(ids), 20);
  r.cache_salt = salt;
  return r;
}

TEST_CASE("Replica B serves replica A's long prompt from Redis with A's greedy tokens",
          "[scheduler][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed (Debian package redis-server): skipped");
    return;
  }
  auto a = MakeReplica(redis.url());
  const Result computed = RunOne(*a, LongPrompt(0, "tenant-1"));
  REQUIRE(computed.usage.cached_prompt_tokens == 0);
  // 18 prompt blocks and the one full block of output are written through.
  REQUIRE(Eventually([&] { return a->GetStats().tiers[kRemote].stored_tokens >= 18 * 16; }));

  auto b = MakeReplica(redis.url());
  const Result served = RunOne(*b, LongPrompt(0, "tenant-1"));
  REQUIRE(served.tokens == computed.tokens);
  REQUIRE(served.usage.cached_prompt_tokens == 18 * 16);
  const EngineStats st = b->GetStats();
  REQUIRE(st.tiers[kRemote].hit_blocks == 18);
  REQUIRE(st.tiers[kRemote].loaded_tokens == 18 * 16);
  REQUIRE(st.tiers[kRemote].load_count == 1);
  REQUIRE(st.tiers[kRemote].rejects == std::array<int64_t, kNumTierRejects>{});
  RequireAllBlocksFree(*b);

  SECTION("another tenant's salt gets none of it and computes the same tokens") {
    const Result other = RunOne(*b, LongPrompt(0, "tenant-2"));
    REQUIRE(other.tokens == computed.tokens);
    REQUIRE(other.usage.cached_prompt_tokens == 0);
    REQUIRE(b->GetStats().tiers[kRemote].hit_blocks == 18);
    RequireAllBlocksFree(*b);
  }
  SECTION("flushed Redis: recomputed with the same tokens") {
    REQUIRE(redis.Command("FLUSHALL") == "OK");
    auto c = MakeReplica(redis.url());
    const Result again = RunOne(*c, LongPrompt(0, "tenant-1"));
    REQUIRE(again.tokens == computed.tokens);
    REQUIRE(again.usage.cached_prompt_tokens == 0);
    REQUIRE(c->GetStats().tiers[kRemote].miss_blocks == 18);
    RequireAllBlocksFree(*c);
  }
}

TEST_CASE("Redis killed mid-run: every request still finishes with the exact tokens",
          "[scheduler][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed: skipped");
    return;
  }
  auto reference = MakeReplica("");
  std::vector<Result> want;
  for (int i = 0; i < 4; ++i) want.push_back(RunOne(*reference, LongPrompt(i)));

  auto a = MakeReplica(redis.url());
  REQUIRE(RunOne(*a, LongPrompt(0)).tokens == want[0].tokens);
  REQUIRE(RunOne(*a, LongPrompt(1)).tokens == want[1].tokens);
  redis.Kill();
  for (int i = 0; i < 4; ++i) {
    const Result r = RunOne(*a, LongPrompt(i));
    REQUIRE(r.finish[0] == FinishReason::kLength);
    REQUIRE(r.tokens == want[i].tokens);
  }
  auto b = MakeReplica(redis.url());  // starts with Redis down
  for (int i = 0; i < 2; ++i) REQUIRE(RunOne(*b, LongPrompt(i)).tokens == want[i].tokens);
  REQUIRE(b->GetStats().tiers[kRemote].hit_blocks == 0);
  RequireAllBlocksFree(*a);
  RequireAllBlocksFree(*b);
}

TEST_CASE("A stalled Redis load past cache.tier_load_timeout_ms is recomputed",
          "[scheduler][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed: skipped");
    return;
  }
  auto a = MakeReplica(redis.url());
  const Result computed = RunOne(*a, LongPrompt(2));
  REQUIRE(Eventually([&] { return a->GetStats().tiers[kRemote].stored_tokens >= 18 * 16; }));
  auto b = MakeReplica(redis.url(), /*timeout_ms=*/200);
  redis.Pause();  // accepts nothing, answers nothing
  const Result r = RunOne(*b, LongPrompt(2));
  redis.Resume();
  REQUIRE(r.tokens == computed.tokens);
  REQUIRE(r.usage.cached_prompt_tokens == 0);
  REQUIRE(b->GetStats().tiers[kRemote].hit_blocks == 0);
  REQUIRE(b->GetStats().tiers[kRemote].load_timeouts == 1);
  RequireAllBlocksFree(*b);
}

// 10 tokens: no full block, so nothing to load; it goes straight to the scheduler.
GenerateRequest ShortPrompt() {
  std::vector<int32_t> ids = Stories().tokenizer->Encode(DevStories()[7], true);
  ids.resize(10);
  return GreedyRequest(std::move(ids), 30);
}

TEST_CASE("Behind a slow Redis one request waits for its load while others step",
          "[scheduler][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed: skipped");
    return;
  }
  auto a = MakeReplica(redis.url());
  const Result computed = RunOne(*a, LongPrompt(4));
  const Result short_ref = RunOne(*a, ShortPrompt());
  REQUIRE(Eventually([&] { return a->GetStats().tiers[kRemote].stored_tokens >= 18 * 16; }));
  GatedProxy proxy(redis.port());
  proxy.Close();  // Redis's replies are held until Open

  SECTION("the waiting request is served from Redis once it answers, with A's tokens") {
    auto b = MakeReplica(proxy.url(), /*timeout_ms=*/60000);
    auto waiting = b->Submit(LongPrompt(4));
    REQUIRE(waiting.ok());
    REQUIRE(Eventually([&] { return b->GetStats().num_tier_loading == 1; }));
    REQUIRE(Eventually([&] { return proxy.held_bytes() > 0; }));  // the worker is answered by none
    // Another request runs to its end meanwhile, with its own exact tokens.
    const Result other = RunOne(*b, ShortPrompt());
    REQUIRE(other.tokens == short_ref.tokens);
    const EngineStats mid = b->GetStats();
    REQUIRE(mid.num_tier_loading == 1);
    REQUIRE(mid.num_running == 0);
    REQUIRE(mid.generated_tokens == 30);
    GenerateOutput out;
    REQUIRE((*waiting)->TryNext(&out) == RequestStream::Pop::kTimeout);
    proxy.Open();
    const Result served = Collect(**waiting);
    REQUIRE(served.tokens == computed.tokens);
    REQUIRE(served.usage.cached_prompt_tokens == 18 * 16);
    const EngineStats st = b->GetStats();
    REQUIRE(st.tiers[kRemote].hit_blocks == 18);
    REQUIRE(st.tiers[kRemote].load_timeouts == 0);
    REQUIRE(st.num_tier_loading == 0);
    RequireAllBlocksFree(*b);
  }
  SECTION("a load past cache.tier_load_timeout_ms is recomputed with the same tokens") {
    auto b = MakeReplica(proxy.url(), /*timeout_ms=*/300);
    const Result r = RunOne(*b, LongPrompt(4));
    REQUIRE(r.tokens == computed.tokens);
    REQUIRE(r.usage.cached_prompt_tokens == 0);
    const EngineStats st = b->GetStats();
    REQUIRE(st.tiers[kRemote].load_timeouts == 1);
    REQUIRE(st.tiers[kRemote].hit_blocks == 0);
    RequireAllBlocksFree(*b);
    proxy.Open();
  }
  SECTION("cancelled while waiting: nothing is held, and the next load is served") {
    auto b = MakeReplica(proxy.url(), /*timeout_ms=*/60000);
    auto waiting = b->Submit(LongPrompt(4));
    REQUIRE(waiting.ok());
    REQUIRE(Eventually([&] { return b->GetStats().num_tier_loading == 1; }));
    (*waiting)->Cancel();
    const Result cancelled = Collect(**waiting);
    REQUIRE(cancelled.finish[0] == FinishReason::kCancelled);
    REQUIRE(cancelled.tokens[0].empty());
    REQUIRE(Eventually([&] { return b->GetStats().requests_finished_cancelled == 1; }));
    REQUIRE(b->GetStats().num_tier_loading == 0);
    RequireAllBlocksFree(*b);
    // The abandoned answer is thrown away; the same prompt loads afresh.
    proxy.Open();
    const Result again = RunOne(*b, LongPrompt(4));
    REQUIRE(again.tokens == computed.tokens);
    REQUIRE(again.usage.cached_prompt_tokens == 18 * 16);
    REQUIRE(b->GetStats().tiers[kRemote].load_timeouts == 0);
    RequireAllBlocksFree(*b);
  }
}

}  // namespace
}  // namespace kvserve
