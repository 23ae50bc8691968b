#include "cache/block_pool.h"

#include <cstdio>
#include <cstdlib>

namespace kvserve {
namespace {

[[noreturn]] void Die(const char* what, BlockId id) {
  std::fprintf(stderr, "BlockPool invariant broken: %s (block %d)\n", what, id);
  std::abort();
}

}  // namespace

BlockPool::BlockPool(int32_t num_blocks)
    : ref_count_(num_blocks, 0), prev_(num_blocks, kNoBlock), next_(num_blocks, kNoBlock) {
  if (num_blocks < 0) Die("negative pool size", num_blocks);
  for (BlockId id = 0; id < num_blocks; ++id) PushBack(id);
}

BlockId BlockPool::Check(BlockId id) const {
  if (id < 0 || id >= num_blocks()) Die("block id out of range", id);
  return id;
}

void BlockPool::Unlink(BlockId id) {
  BlockId p = prev_[id], n = next_[id];
  if (p != kNoBlock)
    next_[p] = n;
  else
    head_ = n;
  if (n != kNoBlock)
    prev_[n] = p;
  else
    tail_ = p;
  prev_[id] = next_[id] = kNoBlock;
  --num_free_;
}

void BlockPool::PushBack(BlockId id) {
  prev_[id] = tail_;
  next_[id] = kNoBlock;
  if (tail_ != kNoBlock)
    next_[tail_] = id;
  else
    head_ = id;
  tail_ = id;
  ++num_free_;
}

std::optional<BlockId> BlockPool::Allocate() {
  if (head_ == kNoBlock) return std::nullopt;
  BlockId id = head_;
  Unlink(id);
  ref_count_[id] = 1;
  return id;
}

std::optional<BlockId> BlockPool::PeekLru() const {
  if (head_ == kNoBlock) return std::nullopt;
  return head_;
}

void BlockPool::Take(BlockId id) {
  if (ref_count_[Check(id)] != 0) Die("Take of a used block", id);
  Unlink(id);
  ref_count_[id] = 1;
}

void BlockPool::AddRef(BlockId id) {
  if (ref_count_[Check(id)] <= 0) Die("AddRef of a free block", id);
  ++ref_count_[id];
}

bool BlockPool::Release(BlockId id) {
  if (ref_count_[Check(id)] <= 0) Die("double free", id);
  if (--ref_count_[id] > 0) return false;
  PushBack(id);
  return true;
}

std::vector<BlockId> BlockPool::FreeListInOrder() const {
  std::vector<BlockId> out;
  out.reserve(num_free_);
  for (BlockId id = head_; id != kNoBlock; id = next_[id]) out.push_back(id);
  return out;
}

}  // namespace kvserve
