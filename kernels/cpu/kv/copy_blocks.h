// Block copies between host KV pools on the CPU, the pair of
// kernels/cuda/kv/copy_blocks.h: the cache manager's fork copies (within a
// pool) and its swaps (between the primary and the swap pool), every layer of
// each block, tails included (ids past a pool's blocks name its tails,
// cache/block_copy.h).
//
// Thread-safety: none; the caller owns both pools for the call.
#pragma once

#include <span>

#include "cache/block_copy.h"
#include "cache/format/kv_pages.h"

namespace kvserve::cpu {

// Copies each block (or tail) cp.src of `from` to cp.dst of `to` in order;
// from and to may be the same pool. Aborts, naming `who`, on an id outside
// either pool.
void CopyBlocks(const HostKvPages& from, HostKvPages& to, std::span<const BlockCopy> copies,
                const char* who);

}  // namespace kvserve::cpu
