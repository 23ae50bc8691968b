// BlockPool: the fixed set of KV blocks, preallocated once. It hands out block
// ids and counts references; it never touches the memory the ids name.
//
// Invariants:
//   * ids are 0 .. num_blocks-1; a block is either free (ref_count 0, on the
//     free list) or used (ref_count >= 1), never both.
//   * the free list is an intrusive doubly-linked list in LRU order: Allocate
//     takes from the head, Release appends to the tail, Take removes any free
//     block in O(1) (for prefix-cache hits on freed blocks).
//   * releasing a block whose ref count is already 0 is a broken invariant and
//     aborts.
// No allocation happens after construction.
//
// Thread-safety: none; the engine thread owns the pool.
//
// Example:
//   BlockPool pool(8);
//   BlockId a = *pool.Allocate();   // 0
//   pool.AddRef(a);                 // shared by a fork: ref 2
//   pool.Release(a);                // ref 1
//   pool.Release(a);                // free again, at the LRU tail
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kvserve {

using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(ref_count_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t num_used() const { return num_blocks() - num_free_; }
  int32_t ref_count(BlockId id) const { return ref_count_[Check(id)]; }
  bool is_free(BlockId id) const { return ref_count_[Check(id)] == 0; }

  // The least recently released free block, ref count 1; nullopt when none.
  std::optional<BlockId> Allocate();
  // The least recently released free block without taking it.
  std::optional<BlockId> PeekLru() const;
  // Takes a specific free block (ref count 0 -> 1). Aborts if it is used.
  void Take(BlockId id);
  // Ref count +1 on a used block (sharing). Aborts if it is free.
  void AddRef(BlockId id);
  // Ref count -1; at 0 the block goes to the tail of the free list. Returns
  // true when the block became free.
  bool Release(BlockId id);

  // Free blocks from least to most recently released (tests, checkers).
  std::vector<BlockId> FreeListInOrder() const;

 private:
  BlockId Check(BlockId id) const;
  void Unlink(BlockId id);
  void PushBack(BlockId id);

  std::vector<int32_t> ref_count_;
  std::vector<BlockId> prev_;  // free-list links; kNoBlock at the ends
  std::vector<BlockId> next_;
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  int32_t num_free_ = 0;
};

}  // namespace kvserve
