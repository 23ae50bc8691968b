// BlockTable: one per sequence, logical block index -> physical block id, plus
// how many tokens of the sequence the cache holds. Token i lives in block
// blocks()[i / block_size] at offset i % block_size.
//
// Thread-safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/block_pool.h"
#include "cache/sizing/block_count.h"

namespace kvserve {

class BlockTable {
 public:
  explicit BlockTable(int32_t block_size) : block_size_(block_size) {}

  int32_t block_size() const { return block_size_; }
  int32_t num_tokens() const { return num_tokens_; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }

  // Blocks needed to hold num_tokens tokens.
  int32_t BlocksFor(int32_t num_tokens) const { return BlocksForTokens(num_tokens, block_size_); }
  // The flat slot (block_id * block_size + offset) of token index i.
  int64_t SlotOf(int32_t i) const {
    return static_cast<int64_t>(blocks_[i / block_size_]) * block_size_ + i % block_size_;
  }

  void AppendBlock(BlockId id) { blocks_.push_back(id); }
  // Drops the last block (eviction shrank the sequence; the caller releases it).
  void PopBlock() { blocks_.pop_back(); }
  void SetBlock(int32_t index, BlockId id) { blocks_[index] = id; }
  void set_num_tokens(int32_t n) { num_tokens_ = n; }
  // Drops every block (the caller releases them to the pool first).
  void Clear() {
    blocks_.clear();
    num_tokens_ = 0;
  }

 private:
  int32_t block_size_;
  int32_t num_tokens_ = 0;
  std::vector<BlockId> blocks_;
};

}  // namespace kvserve
