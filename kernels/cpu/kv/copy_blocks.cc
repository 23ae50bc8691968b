#include "kernels/cpu/kv/copy_blocks.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvserve::cpu {

void CopyBlocks(const HostKvPages& from, HostKvPages& to, std::span<const BlockCopy> copies,
                const char* who) {
  for (const BlockCopy& cp : copies) {
    // Ids past a pool's blocks name its tails (cache/block_copy.h).
    const bool tail = cp.src >= from.num_blocks();
    const int32_t src = tail ? cp.src - from.num_blocks() : cp.src;
    const int32_t dst = tail ? cp.dst - to.num_blocks() : cp.dst;
    const int32_t src_limit = tail ? from.num_tails() : from.num_blocks();
    const int32_t dst_limit = tail ? to.num_tails() : to.num_blocks();
    if (src < 0 || src >= src_limit || dst < 0 || dst >= dst_limit) {
      std::fprintf(stderr,
                   "%s: %s copy %d -> %d outside the pools (%d + %d tails, %d + "
                   "%d tails)\n",
                   who, tail ? "tail" : "block", cp.src, cp.dst, from.num_blocks(),
                   from.num_tails(), to.num_blocks(), to.num_tails());
      std::abort();
    }
    for (int l = 0; l < from.num_layers(); ++l) {
      if (tail) {
        const int64_t bytes = from.format(l).tail_block_bytes();
        if (bytes > 0) std::memmove(to.tail(l, dst), from.tail(l, src), bytes);
      } else {
        std::memmove(to.block(l, dst), from.block(l, src), from.format(l).block_bytes());
      }
    }
  }
}

}  // namespace kvserve::cpu
