// Whole-block copies of the paged KV cache on the GPU, for a list of
// BlockCopy (cache/block_copy.h) in ONE launch: copy-on-write inside the
// device pool, and swap between the device pool and a pinned host pool.
// Every layer of every listed block is copied (K, V and scales: the block's
// bytes are self-describing).
//
// Pools: [num_layers][num_blocks][block_bytes], the layout of
// cache/format/kv_pages.h, one per side (src and dst may be the same pool). The
// host swap pool has the same layout with its own num_blocks, in pinned
// memory from cudaHostAlloc / cudaMallocHost; the kernel reads or writes it
// directly through its mapped device address (MappedDevicePointer below).
//
// Why a kernel over mapped memory for swap, not cudaMemcpyBatchAsync (which
// CUDA 13 has): the copy list then lives on the device in the same form for
// all three batches, one launch covers layers x blocks whatever their
// number (the batch API wants host arrays of num_layers * num_copies
// pointers each step), the launch is capturable in a CUDA graph, and one
// code path serves copy-on-write and both swap directions. The cost: swap
// traffic runs on SMs at PCIe (or C2C) speed instead of on the copy
// engines, so it does not overlap compute on the same stream, which a
// step does not do anyway (swaps run before the forward pass).
//
// Copy list on the device: copies[2 * i] = src, copies[2 * i + 1] = dst,
// two int32 per copy, i.e. exactly the bytes of a host
// std::vector<BlockCopy> (kernels/plan/block_copy_list.h asserts that layout), so
// the caller uploads the vector as is: CopyListBytes(n) bytes. (This header
// does not include cache/block_copy.h: device code is built as C++17.) Within
// one call no block may be the destination twice, and no destination may
// also be a source of the same pool (block_copy.h's batch invariant;
// kernels/plan/block_copy_list.h packs and checks a step's three batches). Pairs
// naming a block outside its pool are skipped, never copied out of bounds.
//
// Example (one step):
//   PackedStepCopies packed = *PackStepCopies(step, num_blocks, num_host_blocks);
//   cudaMemcpyAsync(d_list, packed.pairs.data(), CopyListBytes(packed.pairs.size()), ...);
//   CopyBlocksParams out{d_pool, host_pool_dev, num_blocks, num_host_blocks, L, bytes,
//                        d_list + 2 * packed.swap_out_begin, packed.num_swap_out};
//   KV_RETURN_IF_ERROR(CopyBlocks(out, stream));   // then copies, then swap_in
//
// Thread-safety: stateless; enqueued on `stream`, no synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvserve::cuda {

struct CopyBlocksParams {
  const uint8_t* src = nullptr;  // [num_layers][src_num_blocks][block_bytes], device-accessible
  uint8_t* dst = nullptr;        // [num_layers][dst_num_blocks][block_bytes], device-accessible
  int32_t src_num_blocks = 0;
  int32_t dst_num_blocks = 0;
  int32_t num_layers = 0;
  int64_t block_bytes = 0;          // a multiple of 16 (KvFormat pads blocks to 64)
  const int32_t* copies = nullptr;  // [num_copies][2] {src, dst}, device memory
  int32_t num_copies = 0;
};

// Bytes of a device copy list of n pairs.
constexpr int64_t CopyListBytes(int64_t num_copies) {
  return num_copies * 2 * static_cast<int64_t>(sizeof(int32_t));
}

// InvalidArgument naming the field for bad sizes, null or misaligned
// (16-byte) pools; otherwise the launch's status. num_copies == 0 launches
// nothing.
absl::Status CopyBlocks(const CopyBlocksParams& params, cudaStream_t stream);

// The device address of pinned, mapped host memory (cudaHostGetDevicePointer;
// with unified addressing it is the host address itself). InvalidArgument
// when `host` is not pinned host memory.
absl::StatusOr<uint8_t*> MappedDevicePointer(void* host);

}  // namespace kvserve::cuda
