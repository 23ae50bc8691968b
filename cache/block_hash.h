// Content hashes for automatic prefix caching.
//
// A full block's hash is chained: HashBlock(parent, extra_key, tokens) mixes
// the hash of the block before it (or a seed for the first block), an extra
// key (the request's cache salt, so tenants never share blocks) and the
// block's token ids. Equal hashes therefore mean "same tokens after the same
// prefix under the same salt" up to collisions.
//
// The hash is our own 64-bit multiply-rotate construction (xxHash-style
// rounds: each round is a bijection of the accumulator, followed by a
// murmur3-style final avalanche). It is fast (about 1 ns per token) and not
// cryptographic. The collision risk we accept, and why it is small:
//   * A prefix-cache hit re-checks the block's token ids, extra key and
//     parent hash exactly (PrefixCache stores them), so a false hit needs two
//     *different prefixes* whose 64-bit chain hashes collide, followed by an
//     identical block. With N cached blocks the chance that any such pair
//     exists is below N^2 / 2^65 (N = 10^6: about 3e-8).
//   * A plain key collision (different content, same hash) only costs a miss.
//   * To make collisions impossible to aim for across restarts, the engine can
//     seed every chain with a random KvCacheConfig::hash_seed.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kvserve {

using BlockHash = uint64_t;

// Hash of one full block of `tokens` following a block whose hash is `parent`
// (the chain seed for the first block).
BlockHash HashBlock(BlockHash parent, uint64_t extra_key, std::span<const int32_t> tokens);

// The extra key of a cache salt; the empty salt is 0.
uint64_t HashCacheSalt(std::string_view salt);

}  // namespace kvserve
