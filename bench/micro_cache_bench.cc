// KV cache manager micro-benchmarks: the per-block cost of the operations the
// engine runs every step. Counter per_block: CPU time per block (lower is better).
//
//   BM_AllocateFree         Allocate a fresh prompt (no prefix hit) and Free it.
//   BM_AllocateComputeFree  Same, plus MarkComputed (hash + file every block),
//                           so the freed blocks stay cached and are evicted by
//                           the next round.
//   BM_PrefixHitRunning     Allocate a prompt whose blocks a running sequence
//                           holds (hash, look up, verify, ref + 1), then Free.
//   BM_PrefixHitCached      Same, with the blocks free in the LRU list (Take).
//   BM_HashBlock            One chained hash of a 16-token block.
//   BM_ForkAppendFree       Fork, Append one token (copy-on-write), Free.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "cache/block_hash.h"
#include "cache/kv_cache_manager.h"

namespace kvserve {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPoolBlocks = 8192;

KvCacheConfig Config(bool prefix_caching) {
  KvCacheConfig c;
  c.block_size = kBlockSize;
  c.num_blocks = kPoolBlocks;
  c.enable_prefix_caching = prefix_caching;
  return c;
}

std::vector<int32_t> Prompt(int32_t num_tokens, int32_t seed) {
  std::vector<int32_t> t(num_tokens);
  for (int32_t i = 0; i < num_tokens; ++i) t[i] = (i * 7919 + seed * 104729) % 32000;
  return t;
}

void PerBlock(benchmark::State& state, int64_t blocks_per_iteration) {
  // Seconds per block; printed with an SI prefix ("17.3ns").
  state.counters["per_block"] = benchmark::Counter(
      static_cast<double>(blocks_per_iteration),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_AllocateFree(benchmark::State& state) {
  const int32_t blocks = static_cast<int32_t>(state.range(0));
  const bool caching = state.range(1) != 0;
  KvCacheManager kv(Config(caching));
  const std::vector<int32_t> prompt = Prompt(blocks * kBlockSize, 1);
  for (auto _ : state) {
    auto r = kv.Allocate(1, prompt);
    benchmark::DoNotOptimize(r);
    kv.Free(1);
  }
  PerBlock(state, blocks);
}
BENCHMARK(BM_AllocateFree)->ArgsProduct({{1, 16, 256}, {0, 1}})->ArgNames({"blocks", "apc"});

void BM_AllocateComputeFree(benchmark::State& state) {
  const int32_t blocks = static_cast<int32_t>(state.range(0));
  KvCacheManager kv(Config(true));
  // Distinct prompts so every round misses and evicts the last round's blocks.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 64; ++i) prompts.push_back(Prompt(blocks * kBlockSize, i));
  size_t i = 0;
  for (auto _ : state) {
    const std::vector<int32_t>& p = prompts[i++ % prompts.size()];
    auto r = kv.Allocate(1, p);
    benchmark::DoNotOptimize(r);
    kv.MarkComputed(1, static_cast<int32_t>(p.size()));
    kv.Free(1);
  }
  PerBlock(state, blocks);
}
BENCHMARK(BM_AllocateComputeFree)->Arg(16)->Arg(256)->ArgName("blocks");

void PrefixHit(benchmark::State& state, bool keep_running) {
  const int32_t blocks = static_cast<int32_t>(state.range(0));
  KvCacheManager kv(Config(true));
  // blocks full blocks plus one token, so every full block can hit.
  const std::vector<int32_t> prompt = Prompt(blocks * kBlockSize + 1, 1);
  if (!kv.Allocate(1, prompt).ok()) state.SkipWithError("allocate");
  kv.MarkComputed(1, static_cast<int32_t>(prompt.size()));
  if (!keep_running) kv.Free(1);
  for (auto _ : state) {
    auto r = kv.Allocate(2, prompt);
    if (r->num_cached_tokens != blocks * kBlockSize) state.SkipWithError("missed");
    kv.Free(2);
  }
  PerBlock(state, blocks);
}
void BM_PrefixHitRunning(benchmark::State& state) { PrefixHit(state, true); }
void BM_PrefixHitCached(benchmark::State& state) { PrefixHit(state, false); }
BENCHMARK(BM_PrefixHitRunning)->Arg(16)->Arg(256)->ArgName("blocks");
BENCHMARK(BM_PrefixHitCached)->Arg(16)->Arg(256)->ArgName("blocks");

void BM_HashBlock(benchmark::State& state) {
  const std::vector<int32_t> tokens = Prompt(kBlockSize, 3);
  BlockHash h = 0;
  for (auto _ : state) {
    h = HashBlock(h, 0, tokens);
    benchmark::DoNotOptimize(h);
  }
  PerBlock(state, 1);
}
BENCHMARK(BM_HashBlock);

void BM_ForkAppendFree(benchmark::State& state) {
  KvCacheManager kv(Config(true));
  const std::vector<int32_t> prompt = Prompt(20 * kBlockSize + 5, 1);
  if (!kv.Allocate(1, prompt).ok()) state.SkipWithError("allocate");
  kv.MarkComputed(1, static_cast<int32_t>(prompt.size()));
  for (auto _ : state) {
    kv.Fork(1, 2);
    if (!kv.Append(2, {42}).ok()) state.SkipWithError("append");
    kv.Free(2);
    benchmark::DoNotOptimize(kv.TakePendingCopies());
  }
}
BENCHMARK(BM_ForkAppendFree);

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
