// Model-based randomized test of KvCacheManager: thousands of seeded random
// allocate / append / fork / free / swap-out / swap-in / step operations, with
// the shared invariant checker after every one. Steps also play the backend:
// they run the drained copies on simulated KV memory (one value per slot,
// derived from the salt and every token up to that slot, like real K/V), run
// a "forward" that writes uncomputed slots, and then check that every
// computed token of every sequence reads back its own value. That catches
// wrong prefix hits, lost copy-on-write, bad swap copies and unsafe copy
// ordering, not just bookkeeping errors.
//
// With tail blocks (int4_kc) the simulated backend follows that format's
// contract (cache/format/kv_layout.h): a block is written only by the step that
// completes it, from the rows its sequence's tail held before the step plus
// the step's own; the rows of a partial block live in the tail. So a lost
// or stale tail, a tail written while shared, or a bad tail copy shows up as
// a wrong value in a completed block or in the tail itself.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "tests/cache/kv_cache_checker.h"
#include "tests/cache/kv_cache_sim.h"

namespace kvserve {
namespace {

struct SimSeq {
  std::vector<int32_t> tokens;
  std::string salt;
  int32_t computed = 0;
  bool swapped = false;
};

struct Snapshot {
  int32_t free, swap_free, tails_free, swap_tails_free, seqs;
  size_t swap_out, copies, swap_in;
  int64_t cow, evicted, out, in;
  bool operator==(const Snapshot&) const = default;
};

class Simulation : public testing::KvCacheSimulation<SimSeq> {
 public:
  using KvCacheSimulation::KvCacheSimulation;

  void FreeEverything() {
    while (!seqs_.empty()) {
      kv_.Free(seqs_.begin()->first);
      seqs_.erase(seqs_.begin());
      CheckAll();
    }
    Step();
    CheckAll();
    RequireAllFree();
  }

  int steps() const { return steps_; }

 private:
  void Op(int r) override {
    if (r < 20) return Allocate();
    if (r < 45) return Append();
    if (r < 53) return Fork();
    if (r < (seqs_.size() > 20 ? 75 : 64)) return FreeRandom();
    if (r < 74) return SwapOut();
    if (r < 85) return SwapIn();
    Step();
  }

  Snapshot Snap() const {
    const KvCacheStats st = kv_.Stats();
    const StepCopies& p = kv_.pending_copies();
    return {kv_.pool().num_free(),
            kv_.swap_pool().num_free(),
            kv_.tail_pool().num_free(),
            kv_.swap_tail_pool().num_free(),
            kv_.num_sequences(),
            p.swap_out.size(),
            p.copies.size(),
            p.swap_in.size(),
            st.cow_copies,
            st.evicted_cached_blocks,
            st.swapped_out_blocks,
            st.swapped_in_blocks};
  }

  void Allocate() {
    SimSeq s = RandomSeq();
    const SeqId id = next_id_++;
    const bool can = kv_.CanAllocate(s.tokens, s.salt);
    const Snapshot before = Snap();
    absl::StatusOr<AllocateResult> r = kv_.Allocate(id, s.tokens, s.salt);
    REQUIRE(r.ok() == can);
    if (!r.ok()) {
      REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
      REQUIRE(Snap() == before);
      return;
    }
    REQUIRE(r->num_cached_tokens % bs_ == 0);
    REQUIRE(r->num_cached_tokens < static_cast<int32_t>(s.tokens.size()));
    if (!kv_.config().enable_prefix_caching) REQUIRE(r->num_cached_tokens == 0);
    s.computed = r->num_cached_tokens;
    seqs_.emplace(id, std::move(s));
  }

  void Append() {
    std::vector<SeqId> ids = Pick(false);
    if (ids.empty()) return;
    SimSeq& s = seqs_.at(ids[0]);
    std::vector<int32_t> add(Uniform(1, 3));
    for (int32_t& t : add) t = Uniform(0, 49);
    const bool can = kv_.CanAppend(ids[0], static_cast<int32_t>(add.size()));
    const Snapshot before = Snap();
    absl::Status st = kv_.Append(ids[0], add);
    REQUIRE(st.ok() == can);
    if (!st.ok()) {
      REQUIRE(st.code() == absl::StatusCode::kResourceExhausted);
      REQUIRE(Snap() == before);
      return;
    }
    s.tokens.insert(s.tokens.end(), add.begin(), add.end());
  }

  void Fork() {
    std::vector<SeqId> ids = Pick(
        false, [](const SimSeq& s) { return s.computed == static_cast<int32_t>(s.tokens.size()); });
    if (ids.empty()) return;
    const SeqId child = next_id_++;
    kv_.Fork(ids[0], child);
    seqs_.emplace(child, seqs_.at(ids[0]));
  }

  void SwapGroup(bool out) {
    std::vector<SeqId> ids = Pick(!out);
    if (ids.empty()) return;
    ids.resize(std::min<size_t>(ids.size(), Uniform(1, 2)));
    const bool can = out ? kv_.CanSwapOut(ids) : kv_.CanSwapIn(ids);
    const Snapshot before = Snap();
    absl::Status st = out ? kv_.SwapOut(ids) : kv_.SwapIn(ids);
    REQUIRE(st.ok() == can);
    if (!st.ok()) {
      REQUIRE(st.code() == absl::StatusCode::kResourceExhausted);
      REQUIRE(Snap() == before);
      return;
    }
    for (SeqId id : ids) seqs_.at(id).swapped = out;
  }
  void SwapOut() { SwapGroup(true); }
  void SwapIn() { SwapGroup(false); }

  // Plays one engine step: copies, then a forward over some resident
  // sequences (some only partly: chunked prefill), then MarkComputed.
  void Step() {
    ++steps_;
    RunBlockCopies(kv_.TakePendingCopies());
    CheckContents();

    const std::vector<int32_t> table_refs = TableRefs();
    for (auto& [id, s] : seqs_) {
      const int32_t n = static_cast<int32_t>(s.tokens.size());
      if (s.swapped || s.computed == n || Uniform(0, 4) == 0) continue;
      const int32_t target = Uniform(0, 1) ? n : std::min(n, s.computed + Uniform(1, 2 * bs_));
      const std::vector<uint64_t> values = testing::SlotValues(s.salt, s.tokens);
      const BlockTable& t = kv_.block_table(id);
      if (kv_.has_tails()) {
        WriteWithTail(id, s, values, target, table_refs);
      } else {
        for (int32_t i = s.computed; i < target; ++i) {
          const BlockId b = t.blocks()[i / bs_];
          INFO("sequence " << id << " writes token " << i << " into block " << b);
          RequireWritable(table_refs, b);
          mem_[t.SlotOf(i)] = values[i];
        }
      }
      kv_.MarkComputed(id, target);
      s.computed = target;
    }
    CheckContents();
  }

  // The int4_kc step of one sequence: flush the blocks it completes (rows
  // before `computed` from the tail), then its partial block's rows into
  // the tail.
  void WriteWithTail(SeqId id, const SimSeq& s, const std::vector<uint64_t>& values, int32_t target,
                     const std::vector<int32_t>& table_refs) {
    const BlockTable& t = kv_.block_table(id);
    const int32_t first = s.computed;
    const int32_t tail = kv_.tail_id(id);
    const bool partial = first % bs_ != 0 || target % bs_ != 0;
    INFO("sequence " << id << " computes [" << first << ", " << target << ") with tail " << tail);
    if (partial) REQUIRE(tail >= 0);
    if (tail >= 0) REQUIRE(kv_.tail_pool().ref_count(tail) == 1);  // never a shared tail
    const size_t tail_base = static_cast<size_t>(kv_.pool().num_blocks() + tail) * bs_;
    for (int32_t k = first / bs_; k < target / bs_; ++k) {
      const BlockId b = t.blocks()[k];
      RequireWritable(table_refs, b);
      for (int32_t j = 0; j < bs_; ++j) {
        const int32_t i = k * bs_ + j;
        if (i < first) {
          INFO("token " << i << " from the tail");
          REQUIRE(mem_[tail_base + j] == values[i]);
        }
        mem_[static_cast<size_t>(b) * bs_ + j] = values[i];
      }
    }
    for (int32_t i = std::max(first, target / bs_ * bs_); i < target; ++i) {
      mem_[tail_base + i % bs_] = values[i];
    }
  }

  void CheckContents() const {
    for (const auto& [id, s] : seqs_) {
      const std::vector<uint64_t> values = testing::SlotValues(s.salt, s.tokens);
      const BlockTable& t = kv_.block_table(id);
      const std::vector<uint64_t>& m = s.swapped ? host_mem_ : mem_;
      // With tails, a partial block's computed rows are in the tail.
      const int32_t in_blocks = kv_.has_tails() ? s.computed / bs_ * bs_ : s.computed;
      for (int32_t i = 0; i < in_blocks; ++i) {
        INFO("sequence " << id << (s.swapped ? " (swapped)" : "") << " token " << i << " in block "
                         << t.blocks()[i / bs_]);
        REQUIRE(m[t.SlotOf(i)] == values[i]);
      }
      for (int32_t i = in_blocks; i < s.computed; ++i) {
        const BlockId tail = kv_.tail_block(id);  // extended id
        INFO("sequence " << id << (s.swapped ? " (swapped)" : "") << " token " << i << " in tail "
                         << tail);
        REQUIRE(tail != kNoBlock);
        REQUIRE(m[static_cast<size_t>(tail) * bs_ + i % bs_] == values[i]);
      }
    }
  }

  void CheckAll() const override {
    std::vector<SeqId> live;
    for (const auto& [id, s] : seqs_) {
      live.push_back(id);
      REQUIRE(kv_.IsSwapped(id) == s.swapped);
      REQUIRE(kv_.num_computed_tokens(id) == s.computed);
      const auto ids = kv_.token_ids(id);
      REQUIRE(std::equal(ids.begin(), ids.end(), s.tokens.begin(), s.tokens.end()));
    }
    testing::CheckKvCache(kv_, live);
  }

  int steps_ = 0;
};

TEST_CASE("KvCacheManager with int4_kc tail blocks survives thousands of random operations",
          "[cache]") {
  const bool caching = GENERATE(true, false);
  const auto [block_size, num_blocks, num_tails] =
      GENERATE(std::tuple<int32_t, int32_t, int32_t>{4, 40, 6},
               std::tuple<int32_t, int32_t, int32_t>{16, 12, 3},
               std::tuple<int32_t, int32_t, int32_t>{4, 64, 40});
  const uint64_t seed = GENERATE(1, 2, 3);
  INFO("prefix caching " << caching << ", block_size " << block_size << ", " << num_tails
                         << " tails, seed " << seed);
  KvCacheConfig config = testing::RandomTestConfig(block_size, num_blocks, caching, seed);
  config.num_tail_blocks = num_tails;
  config.num_swap_tail_blocks = num_tails / 2 + 1;
  Simulation sim(config, seed);
  sim.Run(3000);

  const KvCacheStats st = sim.kv().Stats();
  CHECK(st.cow_copies > 0);  // tails copied on write (partial blocks are not copied)
  CHECK(st.swapped_out_blocks > 0);
  CHECK(st.swapped_in_blocks > 0);
  CHECK(sim.steps() > 100);
  CHECK(st.num_tail_blocks == num_tails);
  if (caching) {
    CHECK(st.prefix_hit_tokens > 0);
    CHECK(st.evicted_cached_blocks > 0);
  }
  sim.FreeEverything();
}

TEST_CASE("KvCacheManager survives thousands of random operations", "[cache]") {
  const bool caching = GENERATE(true, false);
  const auto [block_size, num_blocks] =
      GENERATE(std::pair<int32_t, int32_t>{4, 40}, std::pair<int32_t, int32_t>{1, 96},
               std::pair<int32_t, int32_t>{16, 12});
  const uint64_t seed = GENERATE(1, 2, 3);
  INFO("prefix caching " << caching << ", block_size " << block_size << ", seed " << seed);
  Simulation sim(testing::RandomTestConfig(block_size, num_blocks, caching, seed), seed);
  sim.Run(3000);

  // The run exercised every path, not just the easy ones.
  const KvCacheStats st = sim.kv().Stats();
  if (block_size > 1) CHECK(st.cow_copies > 0);  // size-1 blocks are never partial
  CHECK(st.swapped_out_blocks > 0);
  CHECK(st.swapped_in_blocks > 0);
  CHECK(sim.steps() > 100);
  if (caching) {
    CHECK(st.prefix_hit_tokens > 0);
    CHECK(st.evicted_cached_blocks > 0);
  } else {
    CHECK(st.prefix_queries == 0);
  }
  sim.FreeEverything();
}

}  // namespace
}  // namespace kvserve
