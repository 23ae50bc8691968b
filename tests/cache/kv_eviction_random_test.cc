// Model-based randomized test of eviction on the paged cache: sequences with
// random policies and budgets are admitted (sharing prefixes and salts),
// stepped, forked, swapped, evicted and freed at random, the way the engine
// drives them (SequenceEvictor decides, KvCacheManager::Evict carries out,
// copies and slot moves are drained right after). The test plays the
// backend on simulated KV memory (one value per slot, derived from the salt
// and every token up to the entry's position, like real K/V) and checks,
// after every operation and step:
//   * every entry a sequence holds reads back the value of the token its
//     eviction state says is there (moves, copy-on-write, swap are right);
//   * no write (new token or slot move) lands in a block another sequence or
//     the prefix cache holds;
//   * a sequence never holds more than budget / block_size + 2 blocks;
//   * an evicted sequence never files a block (computing or swapping it in
//     never adds to the prefix cache);
//   * the shared invariant checker passes, and all blocks return at the end.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/eviction/sequence_evictor.h"
#include "cache/kv_cache_manager.h"
#include "tests/cache/kv_cache_checker.h"
#include "tests/cache/kv_cache_sim.h"

namespace kvserve {
namespace {

struct SimSeq {
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;
  std::string salt;
  int32_t computed = 0;  // absolute tokens computed
  bool swapped = false;
  std::shared_ptr<SequenceEvictor> evictor;  // copied on fork
  bool evicted = false;
};

class EvictionSimulation : public testing::KvCacheSimulation<SimSeq> {
 public:
  using KvCacheSimulation::KvCacheSimulation;

  void FreeEverything() {
    while (!seqs_.empty()) {
      kv_.Free(seqs_.begin()->first);
      seqs_.erase(seqs_.begin());
    }
    kv_.TakePendingCopies();
    CheckAll();
    RequireAllFree();
  }

  int64_t evictions() const { return evictions_; }
  int64_t refused() const { return refused_; }

 private:
  void Op(int r) override {
    if (r < 15) return Admit();
    if (r < 22) return Fork();
    if (r < (seqs_.size() > 12 ? 45 : 30)) return FreeRandom();
    if (r < 36) return Swap(true);
    if (r < 44) return Swap(false);
    Step();
  }

  int32_t CacheLen(SeqId id) const { return kv_.num_tokens(id); }

  int32_t CountFiled() const {
    int32_t n = 0;
    for (BlockId b = 0; b < kv_.pool().num_blocks(); ++b) n += kv_.IsCachedBlock(b) ? 1 : 0;
    return n;
  }

  void Admit() {
    SimSeq s = RandomSeq();
    s.prompt_len = static_cast<int32_t>(s.tokens.size());
    static constexpr EvictionPolicyKind kKinds[] = {
        EvictionPolicyKind::kSlidingWindow, EvictionPolicyKind::kStreaming,
        EvictionPolicyKind::kH2o, EvictionPolicyKind::kScissorhands};
    EvictionParams p;
    p.policy = kKinds[Uniform(0, 3)];
    p.budget = Uniform(2, 13);
    p.sink_tokens = Uniform(0, std::min(4, p.budget - 1));
    p.recent_tokens = Uniform(0, p.budget - 1);
    if (p.policy == EvictionPolicyKind::kStreaming) p.recent_tokens = 0;
    p.history = Uniform(1, 8);
    REQUIRE(p.Validate(kEvictionConfigFields).ok());
    s.evictor = std::make_shared<SequenceEvictor>(MakeEvictionPolicy(p.policy), p, p.budget + bs_);
    const int32_t first = s.evictor->StepRows(0, s.prompt_len);
    std::span<const int32_t> chunk(s.tokens.data(), first);
    const SeqId id = next_id_++;
    if (!kv_.CanAllocate(chunk, s.salt)) return;
    absl::StatusOr<AllocateResult> r = kv_.Allocate(id, chunk, s.salt);
    REQUIRE(r.ok());
    s.computed = r->num_cached_tokens;
    // Entries that came from the cache are the sequence's first ones.
    std::vector<int32_t> positions(s.computed);
    for (int32_t i = 0; i < s.computed; ++i) positions[i] = i;
    if (s.computed > 0) ObserveRandom(s, positions);
    seqs_.emplace(id, std::move(s));
  }

  void Fork() {
    for (SeqId id : Pick(false)) {
      SimSeq& s = seqs_.at(id);
      if (kv_.num_computed_tokens(id) != CacheLen(id)) continue;
      const SeqId child = next_id_++;
      kv_.Fork(id, child);
      SimSeq copy = s;
      copy.evictor = std::make_shared<SequenceEvictor>(*s.evictor);
      seqs_.emplace(child, std::move(copy));
      return;
    }
  }

  void Swap(bool out) {
    const std::vector<SeqId> picked = Pick(!out);
    if (picked.empty()) return;
    const std::vector<SeqId> ids = {picked[0]};
    const bool can = out ? kv_.CanSwapOut(ids) : kv_.CanSwapIn(ids);
    const int32_t filed = CountFiled();
    absl::Status st = out ? kv_.SwapOut(ids) : kv_.SwapIn(ids);
    REQUIRE(st.ok() == can);
    if (!st.ok()) return;
    if (!out && seqs_.at(ids[0]).evicted) REQUIRE(CountFiled() <= filed);
    seqs_.at(ids[0]).swapped = out;
    RunCopies();
  }

  void ObserveRandom(SimSeq& s, const std::vector<int32_t>& positions) {
    const int32_t n = s.evictor->state().size() + static_cast<int32_t>(positions.size());
    std::vector<float> mass(n);
    for (float& m : mass) m = static_cast<float>(Uniform(0, 1000)) / 1000.0f;
    s.evictor->Observe(positions, mass, 1, 1, std::max<int32_t>(1, positions.size()));
  }

  void RunCopies() {
    const StepCopies copies = kv_.TakePendingCopies();
    RunBlockCopies(copies);
    const std::vector<int32_t> refs = TableRefs();
    for (const SlotMove& m : copies.slot_moves) {
      INFO("slot move " << m.src << " -> " << m.dst);
      RequireWritable(refs, static_cast<BlockId>(m.dst / bs_));
      mem_[m.dst] = mem_[m.src];
    }
  }

  // One engine step over a random subset of resident sequences.
  void Step() {
    RunCopies();
    std::vector<std::pair<SeqId, int32_t>> planned;  // sequence, rows
    for (auto& [id, s] : seqs_) {
      if (s.swapped || Uniform(0, 3) == 0) continue;
      const int32_t cache_len = CacheLen(id);
      const int32_t unreserved = static_cast<int32_t>(s.tokens.size()) - s.computed;
      int32_t rows;
      if (kv_.num_computed_tokens(id) < cache_len) {
        rows = cache_len - kv_.num_computed_tokens(id);  // admitted: chunk reserved
      } else {
        if (unreserved == 0) s.tokens.push_back(Uniform(0, 49));  // the sampled token
        rows = s.evictor->StepRows(cache_len, std::max(0, s.prompt_len - s.computed));
        if (!kv_.CanAppend(id, rows)) continue;
        std::span<const int32_t> add(s.tokens.data() + s.computed, rows);
        REQUIRE(kv_.Append(id, add).ok());
      }
      planned.emplace_back(id, rows);
    }
    RunCopies();  // copy-on-write from the appends
    const std::vector<int32_t> refs = TableRefs();
    for (const auto& [id, rows] : planned) {
      SimSeq& s = seqs_.at(id);
      const BlockTable& t = kv_.block_table(id);
      const int32_t len = t.num_tokens();
      REQUIRE(t.num_blocks() <= s.evictor->params().budget / bs_ + 2);
      std::vector<int32_t> positions;
      const std::vector<uint64_t> values = testing::SlotValues(s.salt, s.tokens);
      for (int32_t k = 0; k < rows; ++k) {
        const int32_t i = len - rows + k;
        const BlockId b = t.blocks()[i / bs_];
        INFO("sequence " << id << " writes entry " << i << " into block " << b);
        RequireWritable(refs, b);
        mem_[t.SlotOf(i)] = values[s.computed + k];
        positions.push_back(s.computed + k);
      }
      const int32_t filed = CountFiled();
      kv_.MarkComputed(id, len);
      if (s.evicted) REQUIRE(CountFiled() == filed);
      s.computed += rows;
      ObserveRandom(s, positions);
    }
    // Evictions, then their moves at once.
    for (const auto& [id, rows] : planned) {
      auto it = seqs_.find(id);
      SimSeq& s = it->second;
      const std::vector<int32_t>& victims = s.evictor->SelectVictims();
      if (victims.empty()) continue;
      absl::StatusOr<EvictResult> r = kv_.Evict(id, victims);
      if (!r.ok()) {
        REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
        ++refused_;
        kv_.Free(id);  // the engine preempts it
        seqs_.erase(it);
        continue;
      }
      ++evictions_;
      s.evictor->Compact(*r);
      REQUIRE(kv_.num_tokens(id) == s.evictor->params().budget - 1);
      s.evicted = true;
    }
    RunCopies();
    CheckContents();
  }

  void CheckContents() const {
    for (const auto& [id, s] : seqs_) {
      const BlockTable& t = kv_.block_table(id);
      const std::vector<uint64_t>& m = s.swapped ? host_mem_ : mem_;
      const auto pos = s.evictor->state().positions();
      const std::vector<uint64_t> values = testing::SlotValues(s.salt, s.tokens);
      REQUIRE(static_cast<int32_t>(pos.size()) == kv_.num_computed_tokens(id));
      for (int32_t i = 0; i < kv_.num_computed_tokens(id); ++i) {
        INFO("sequence " << id << " entry " << i << " position " << pos[i]);
        REQUIRE(m[t.SlotOf(i)] == values[pos[i]]);
      }
    }
  }

  void CheckAll() const override {
    std::vector<SeqId> live;
    for (const auto& [id, s] : seqs_) {
      live.push_back(id);
      REQUIRE(kv_.IsSwapped(id) == s.swapped);
      REQUIRE(kv_.HasEvicted(id) == s.evicted);
      REQUIRE(kv_.block_table(id).num_blocks() <= s.evictor->params().budget / bs_ + 2);
    }
    testing::CheckKvCache(kv_, live);
  }

  int64_t evictions_ = 0;
  int64_t refused_ = 0;
};

TEST_CASE("Eviction survives thousands of random operations with exact contents",
          "[cache][eviction]") {
  const bool caching = GENERATE(true, false);
  const auto [block_size, num_blocks] =
      GENERATE(std::pair<int32_t, int32_t>{4, 40}, std::pair<int32_t, int32_t>{1, 120},
               std::pair<int32_t, int32_t>{8, 24});
  const uint64_t seed = GENERATE(1, 2, 3);
  INFO("prefix caching " << caching << ", block_size " << block_size << ", seed " << seed);
  EvictionSimulation sim(testing::RandomTestConfig(block_size, num_blocks, caching, seed), seed);
  sim.Run(3000);
  const KvCacheStats st = sim.kv().Stats();
  CHECK(sim.evictions() > 200);
  CHECK(st.kv_eviction_slot_moves > 0);
  CHECK(st.kv_eviction_freed_blocks > 0);
  CHECK(st.cow_copies > 0);
  CHECK(st.swapped_in_blocks > 0);
  if (caching) CHECK(st.prefix_hit_tokens > 0);
  sim.FreeEverything();
}

}  // namespace
}  // namespace kvserve
