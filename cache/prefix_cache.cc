#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

[[noreturn]] void Die(const char* what, BlockId id) {
  std::fprintf(stderr, "PrefixCache invariant broken: %s (block %d)\n", what, id);
  std::abort();
}

}  // namespace

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      registered_(num_blocks, 0),
      hash_(num_blocks, 0),
      parent_(num_blocks, 0),
      extra_key_(num_blocks, 0),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0) {
  by_hash_.reserve(num_blocks);
}

BlockId PrefixCache::Find(BlockHash hash, BlockHash parent, uint64_t extra_key,
                          std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return kNoBlock;
  const BlockId id = it->second;
  if (parent_[id] != parent || extra_key_[id] != extra_key) return kNoBlock;
  const int32_t* stored = tokens_.data() + static_cast<size_t>(id) * block_size_;
  if (!std::equal(tokens.begin(), tokens.end(), stored)) return kNoBlock;
  return id;
}

bool PrefixCache::Insert(BlockId id, BlockHash hash, BlockHash parent, uint64_t extra_key,
                         std::span<const int32_t> tokens) {
  if (registered_[id]) Die("Insert of a registered block", id);
  if (static_cast<int32_t>(tokens.size()) != block_size_) Die("Insert of a partial block", id);
  if (!by_hash_.try_emplace(hash, id).second) return false;
  registered_[id] = 1;
  hash_[id] = hash;
  parent_[id] = parent;
  extra_key_[id] = extra_key;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(id) * block_size_);
  return true;
}

void PrefixCache::Erase(BlockId id) {
  if (!registered_[id]) return;
  auto it = by_hash_.find(hash_[id]);
  if (it == by_hash_.end() || it->second != id) Die("registration missing from the map", id);
  by_hash_.erase(it);
  registered_[id] = 0;
}

absl::Status PrefixCache::CheckConsistent() const {
  int32_t count = 0;
  for (BlockId id = 0; id < static_cast<BlockId>(registered_.size()); ++id) {
    if (!registered_[id]) continue;
    ++count;
    auto it = by_hash_.find(hash_[id]);
    if (it == by_hash_.end() || it->second != id) {
      return absl::InternalError(absl::StrCat("block ", id, " is registered but not in the map"));
    }
  }
  if (count != size()) {
    return absl::InternalError(
        absl::StrCat("the map holds ", size(), " hashes but ", count, " blocks are registered"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve
