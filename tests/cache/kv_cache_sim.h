// What the model-based random tests of the paged cache share
// (kv_cache_random_test.cc, kv_eviction_random_test.cc): a KvCacheManager
// driven by a seeded generator over simulated KV memory, with one value per
// slot that depends on the sequence's salt and every token up to that slot
// (as real K/V do), so a wrong prefix hit, a lost copy or a misplaced move
// reads back a wrong value.
//
// Seq is the test's per-sequence model; it needs `tokens`, `salt` and
// `swapped` members.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cache_manager.h"

namespace kvserve::testing {

// The value slot i of a sequence must hold, for every i.
inline std::vector<uint64_t> SlotValues(const std::string& salt, std::span<const int32_t> tokens) {
  std::vector<uint64_t> v(tokens.size());
  uint64_t h = 0x243F6A8885A308D3ull ^ std::hash<std::string>{}(salt);
  for (size_t i = 0; i < tokens.size(); ++i) {
    h ^= static_cast<uint64_t>(tokens[i]) + 0x9E3779B97F4A7C15ull * (i + 1);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    v[i] = h;
  }
  return v;
}

// The pools the random tests run on: a swap pool half the primary's size,
// prefix caching on or off, block hashes seeded per run.
inline KvCacheConfig RandomTestConfig(int32_t block_size, int32_t num_blocks, bool caching,
                                      uint64_t seed) {
  KvCacheConfig config;
  config.block_size = block_size;
  config.num_blocks = num_blocks;
  config.num_swap_blocks = num_blocks / 2;
  config.enable_prefix_caching = caching;
  config.hash_seed = seed;
  return config;
}

template <typename Seq>
class KvCacheSimulation {
 public:
  KvCacheSimulation(const KvCacheConfig& config, uint64_t seed)
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

  virtual ~KvCacheSimulation() = default;

  const KvCacheManager& kv() const { return kv_; }

  // num_ops random operations: Op(roll) with a roll in [0, 99] to choose
  // by, then CheckAll() after each.
  void Run(int num_ops) {
    for (int i = 0; i < num_ops; ++i) {
      const int roll = Uniform(0, 99);
      INFO("op " << i << " roll " << roll);
      Op(roll);
      CheckAll();
    }
  }

 protected:
  virtual void Op(int roll) = 0;
  virtual void CheckAll() const = 0;

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // A prompt that often shares a prefix with others (three bases), and now
  // and then a second tenant's salt.
  Seq RandomSeq() {
    Seq s;
    const auto& base = bases_[Uniform(0, 2)];
    s.tokens.assign(base.begin(), base.begin() + Uniform(1, 24));
    for (int n = Uniform(0, 6); n > 0; --n) s.tokens.push_back(Uniform(0, 49));
    if (Uniform(0, 4) == 0) s.salt = "tenant-b";
    return s;
  }

  // Live sequences that are (or are not) swapped out, and pass `keep` if
  // given, in random order.
  std::vector<SeqId> Pick(bool swapped, const std::function<bool(const Seq&)>& keep = nullptr) {
    std::vector<SeqId> out;
    for (const auto& [id, s] : seqs_) {
      if (s.swapped == swapped && (!keep || keep(s))) out.push_back(id);
    }
    std::shuffle(out.begin(), out.end(), rng_);
    return out;
  }

  void FreeRandom() {
    if (seqs_.empty()) return;
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    kv_.Free(it->first);
    seqs_.erase(it);
  }

  // Plays the backend's block copies, in the order the engine runs them.
  void RunBlockCopies(const StepCopies& copies) {
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
  }

  // How many resident block tables hold each block: a write must only go to
  // a block with one.
  std::vector<int32_t> TableRefs() const {
    std::vector<int32_t> refs(kv_.pool().num_blocks(), 0);
    for (const auto& [id, s] : seqs_) {
      if (!s.swapped) {
        for (BlockId b : kv_.block_table(id).blocks()) ++refs[b];
      }
    }
    return refs;
  }

  // Every pool is whole again (after freeing every sequence).
  void RequireAllFree() const {
    REQUIRE(kv_.pool().num_free() == kv_.pool().num_blocks());
    REQUIRE(kv_.swap_pool().num_free() == kv_.swap_pool().num_blocks());
    REQUIRE(kv_.tail_pool().num_free() == kv_.tail_pool().num_blocks());
    REQUIRE(kv_.swap_tail_pool().num_free() == kv_.swap_tail_pool().num_blocks());
    REQUIRE(kv_.Stats().num_active_blocks == 0);
  }

  // Asserts that a write into block b is allowed: not shared, not cached.
  void RequireWritable(const std::vector<int32_t>& refs, BlockId b) const {
    REQUIRE(refs[b] == 1);
    REQUIRE_FALSE(kv_.IsCachedBlock(b));
  }

  KvCacheManager kv_;
  const int32_t bs_;
  std::mt19937_64 rng_;
  std::vector<uint64_t> mem_, host_mem_;
  std::vector<int32_t> bases_[3];
  std::map<SeqId, Seq> seqs_;
  SeqId next_id_ = 1;
};

}  // namespace kvserve::testing
