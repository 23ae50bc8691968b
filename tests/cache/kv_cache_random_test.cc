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
// contract (cache/kv_layout.h): a block is written only by the step that
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

namespace kvserve {
namespace {

struct SimSeq {
  std::vector<int32_t> tokens;
  std::string salt;
  int32_t computed = 0;
  bool swapped = false;
};

// What slot i of a sequence must hold: depends on the salt (so a cross-salt
// hit would be caught) and on every token 0..i (so a wrong prefix would be).
std::vector<uint64_t> SlotValues(const SimSeq& s) {
  std::vector<uint64_t> v(s.tokens.size());
  uint64_t h = 0x243F6A8885A308D3ull ^ std::hash<std::string>{}(s.salt);
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    h ^= static_cast<uint64_t>(s.tokens[i]) + 0x9E3779B97F4A7C15ull * (i + 1);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    v[i] = h;
  }
  return v;
}

struct Snapshot {
  int32_t free, swap_free, tails_free, swap_tails_free, seqs;
  size_t swap_out, copies, swap_in;
  int64_t cow, evicted, out, in;
  bool operator==(const Snapshot&) const = default;
};

class Simulation {
 public:
  Simulation(const KvCacheConfig& config, uint64_t seed)
      : kv_(config),
        bs_(config.block_size),
        rng_(seed),
        // Blocks, then tails (extended ids), one value per slot.
        mem_(static_cast<size_t>(config.num_blocks + config.num_tail_blocks) * config.block_size,
             0),
        host_mem_(static_cast<size_t>(config.num_swap_blocks + config.num_swap_tail_blocks) *
                      config.block_size,
                  0) {
    for (auto& base : bases_) {
      base.resize(24);
      for (int32_t& t : base) t = Uniform(0, 49);
    }
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int r = Uniform(0, 99);
      INFO("op " << op << " roll " << r);
      if (r < 20) {
        Allocate();
      } else if (r < 45) {
        Append();
      } else if (r < 53) {
        Fork();
      } else if (r < (seqs_.size() > 20 ? 75 : 64)) {
        Free();
      } else if (r < 74) {
        SwapOut();
      } else if (r < 85) {
        SwapIn();
      } else {
        Step();
      }
      CheckAll();
    }
  }

  void FreeEverything() {
    while (!seqs_.empty()) {
      kv_.Free(seqs_.begin()->first);
      seqs_.erase(seqs_.begin());
      CheckAll();
    }
    Step();
    CheckAll();
    REQUIRE(kv_.pool().num_free() == kv_.pool().num_blocks());
    REQUIRE(kv_.swap_pool().num_free() == kv_.swap_pool().num_blocks());
    REQUIRE(kv_.tail_pool().num_free() == kv_.tail_pool().num_blocks());
    REQUIRE(kv_.swap_tail_pool().num_free() == kv_.swap_tail_pool().num_blocks());
    REQUIRE(kv_.Stats().num_active_blocks == 0);
  }

  const KvCacheManager& kv() const { return kv_; }
  int steps() const { return steps_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::vector<SeqId> Pick(bool swapped, bool fully_computed = false) {
    std::vector<SeqId> out;
    for (const auto& [id, s] : seqs_) {
      if (s.swapped == swapped &&
          (!fully_computed || s.computed == static_cast<int32_t>(s.tokens.size()))) {
        out.push_back(id);
      }
    }
    std::shuffle(out.begin(), out.end(), rng_);
    return out;
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
    SimSeq s;
    const auto& base = bases_[Uniform(0, 2)];
    s.tokens.assign(base.begin(), base.begin() + Uniform(1, 24));
    for (int n = Uniform(0, 6); n > 0; --n) s.tokens.push_back(Uniform(0, 49));
    if (Uniform(0, 4) == 0) s.salt = "tenant-b";
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
    std::vector<SeqId> ids = Pick(false, true);
    if (ids.empty()) return;
    const SeqId child = next_id_++;
    kv_.Fork(ids[0], child);
    seqs_.emplace(child, seqs_.at(ids[0]));
  }

  void Free() {
    if (seqs_.empty()) return;
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    kv_.Free(it->first);
    seqs_.erase(it);
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
    const StepCopies copies = kv_.TakePendingCopies();
    auto run = [&](const std::vector<BlockCopy>& batch, std::vector<uint64_t>& from,
                   std::vector<uint64_t>& to) {
      for (const BlockCopy& c : batch) {
        std::copy_n(from.begin() + static_cast<size_t>(c.src) * bs_, bs_,
                    to.begin() + static_cast<size_t>(c.dst) * bs_);
      }
    };
    run(copies.swap_out, mem_, host_mem_);
    run(copies.copies, mem_, mem_);
    run(copies.swap_in, host_mem_, mem_);
    CheckContents();

    std::vector<int32_t> table_refs(kv_.pool().num_blocks(), 0);
    for (const auto& [id, s] : seqs_) {
      if (!s.swapped) {
        for (BlockId b : kv_.block_table(id).blocks()) ++table_refs[b];
      }
    }
    for (auto& [id, s] : seqs_) {
      const int32_t n = static_cast<int32_t>(s.tokens.size());
      if (s.swapped || s.computed == n || Uniform(0, 4) == 0) continue;
      const int32_t target = Uniform(0, 1) ? n : std::min(n, s.computed + Uniform(1, 2 * bs_));
      const std::vector<uint64_t> values = SlotValues(s);
      const BlockTable& t = kv_.block_table(id);
      if (kv_.has_tails()) {
        WriteWithTail(id, s, values, target, table_refs);
      } else {
        for (int32_t i = s.computed; i < target; ++i) {
          const BlockId b = t.blocks()[i / bs_];
          INFO("sequence " << id << " writes token " << i << " into block " << b);
          REQUIRE(table_refs[b] == 1);          // never into a shared block
          REQUIRE_FALSE(kv_.IsCachedBlock(b));  // never into a cached block
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
      REQUIRE(table_refs[b] == 1);
      REQUIRE_FALSE(kv_.IsCachedBlock(b));
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
      const std::vector<uint64_t> values = SlotValues(s);
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

  void CheckAll() const {
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

  KvCacheManager kv_;
  int32_t bs_;
  std::mt19937_64 rng_;
  std::vector<uint64_t> mem_, host_mem_;
  std::vector<int32_t> bases_[3];
  std::map<SeqId, SimSeq> seqs_;
  SeqId next_id_ = 1;
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
  KvCacheConfig config;
  config.block_size = block_size;
  config.num_blocks = num_blocks;
  config.num_swap_blocks = num_blocks / 2;
  config.num_tail_blocks = num_tails;
  config.num_swap_tail_blocks = num_tails / 2 + 1;
  config.enable_prefix_caching = caching;
  config.hash_seed = seed;
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
  KvCacheConfig config;
  config.block_size = block_size;
  config.num_blocks = num_blocks;
  config.num_swap_blocks = num_blocks / 2;
  config.enable_prefix_caching = caching;
  config.hash_seed = seed;
  Simulation sim(config, seed);
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
