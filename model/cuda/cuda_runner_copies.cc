// CudaModelRunner: block copies in the device pool, swap to and from the
// pinned host pool, and the KV tiers' export and import of whole blocks
// (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/kv/copy_blocks.h"
#include "model/cuda/cuda_runner_impl.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::CudaStatus;

}  // namespace

// ---- Copies ------------------------------------------------------------------

// A copy's pool-local ids: ids past a pool's blocks name its tails
// (cache/block_copy.h), local to the tail pool. An id outside the pools is
// a scheduler bug: abort with both pools' sizes.
struct LocalCopy {
  bool tail;
  int32_t src, dst;
};
static LocalCopy Localize(const BlockCopy& cp, const PoolShape& from, const PoolShape& to,
                          const char* what) {
  const bool tail = cp.src >= from.blocks;
  const int32_t s = tail ? cp.src - from.blocks : cp.src;
  const int32_t d = tail ? cp.dst - to.blocks : cp.dst;
  if (cp.src < 0 || cp.dst < 0 || s >= (tail ? from.tails : from.blocks) || d < 0 ||
      d >= (tail ? to.tails : to.blocks)) {
    std::fprintf(stderr,
                 "CudaModelRunner::%s: %s copy %d -> %d outside the pools (%d + %d tails, %d + %d "
                 "tails)\n",
                 what, tail ? "tail" : "block", cp.src, cp.dst, from.blocks, from.tails, to.blocks,
                 to.tails);
    std::abort();
  }
  return {tail, s, d};
}

absl::Status CudaModelRunner::Impl::RunCopies(std::span<const BlockCopy> copies, const uint8_t* src,
                                              const PoolShape& from, uint8_t* dst,
                                              const PoolShape& to, const char* what) {
  if (copies.empty()) return absl::OkStatus();
  // Ids past a pool's blocks name its tails (cache/block_copy.h); a copy is
  // block to block or tail to tail. Block pairs first, then tail pairs
  // (tail-local ids), in one upload.
  std::vector<BlockCopy> pairs;
  pairs.reserve(copies.size());
  int64_t num_block_pairs = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const BlockCopy& cp : copies) {
      const LocalCopy c = Localize(cp, from, to, what);
      if (c.tail == (pass == 1)) pairs.push_back({c.src, c.dst});
    }
    if (pass == 0) num_block_pairs = static_cast<int64_t>(pairs.size());
  }
  const int64_t n = static_cast<int64_t>(pairs.size());
  KV_RETURN_IF_ERROR(EnsureCopyCapacity(n));
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copies_uploaded));
  std::memcpy(copies_host.get(), pairs.data(), cuda::CopyListBytes(n));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies_dev.get(), copies_host.get(),
                                          cuda::CopyListBytes(n), cudaMemcpyHostToDevice, stream));
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_uploaded, stream));
  const int32_t* list = reinterpret_cast<const int32_t*>(copies_dev.get());
  const int L = config.num_layers;
  bool uniform = true;
  for (const KvFormat& f : formats) uniform &= f.block_bytes() == formats[0].block_bytes();
  // Blocks: one launch over every layer when they share a block size (the
  // regions are then [L][blocks][block_bytes]), else one per layer.
  for (int layer = 0; num_block_pairs > 0 && layer < L; ++layer) {
    cuda::CopyBlocksParams p;
    p.src = src + from.layer_offset[layer];
    p.dst = dst + to.layer_offset[layer];
    p.src_num_blocks = from.blocks;
    p.dst_num_blocks = to.blocks;
    p.num_layers = uniform ? L : 1;
    p.block_bytes = formats[layer].block_bytes();
    p.copies = list;
    p.num_copies = static_cast<int32_t>(num_block_pairs);
    KV_RETURN_IF_ERROR(cuda::CopyBlocks(p, stream));
    if (uniform) break;
  }
  // Tails: one launch per layer that keeps them.
  for (int layer = 0; n > num_block_pairs && layer < L; ++layer) {
    if (!formats[layer].has_tails()) continue;
    cuda::CopyBlocksParams p;
    p.src = src + from.tail_offset[layer];
    p.dst = dst + to.tail_offset[layer];
    p.src_num_blocks = from.tails;
    p.dst_num_blocks = to.tails;
    p.num_layers = 1;
    p.block_bytes = formats[layer].tail_block_bytes();
    p.copies = list + 2 * num_block_pairs;
    p.num_copies = static_cast<int32_t>(n - num_block_pairs);
    KV_RETURN_IF_ERROR(cuda::CopyBlocks(p, stream));
  }
  return absl::OkStatus();
}

bool CudaModelRunner::Impl::EvenLayers(const PoolShape& pool) const {
  const int L = config.num_layers;
  if (L < 2) return false;
  for (const KvFormat& f : formats) {
    if (f.block_bytes() != formats[0].block_bytes()) return false;
  }
  const std::vector<int64_t>& off = pool.layer_offset;
  for (int l = 2; l < L; ++l) {
    if (off[l] - off[l - 1] != off[1] - off[0]) return false;
  }
  return true;
}

absl::Status CudaModelRunner::Impl::CopyBlockLayers(const LayerSpan& dst, const LayerSpan& src,
                                                    cudaMemcpyKind kind, cudaStream_t on) {
  const int L = config.num_layers;
  const auto at = [&](const LayerSpan& x, int l, int64_t packed) {
    return x.pool == nullptr
               ? x.base + packed
               : x.base + x.pool->layer_offset[l] + int64_t(x.block) * formats[l].block_bytes();
  };
  const auto pitch = [&](const LayerSpan& x) {
    return x.pool == nullptr ? formats[0].block_bytes()
                             : x.pool->layer_offset[1] - x.pool->layer_offset[0];
  };
  const auto even = [&](const LayerSpan& x) { return x.pool == nullptr || EvenLayers(*x.pool); };
  if (L > 1 && even(dst) && even(src) && (dst.pool != nullptr || src.pool != nullptr)) {
    return CudaStatus(cudaMemcpy2DAsync(at(dst, 0, 0), pitch(dst), at(src, 0, 0), pitch(src),
                                        formats[0].block_bytes(), L, kind, on),
                      "a block's layers");
  }
  int64_t packed = 0;
  for (int l = 0; l < L; ++l) {
    const int64_t bb = formats[l].block_bytes();
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(at(dst, l, packed), at(src, l, packed), bb, kind, on));
    packed += bb;
  }
  return absl::OkStatus();
}

bool CudaModelRunner::Impl::InTierArena(const uint8_t* p) const {
  const uint8_t* base = tier_arena.get();
  int64_t per = 0;
  for (const KvFormat& f : formats) per += f.block_bytes();
  return base != nullptr && p >= base && p + per <= base + tier_arena_bytes;
}

absl::Status CudaModelRunner::Impl::TierCopies(std::span<const BlockId> blocks,
                                               uint8_t* const* host, bool out, bool async,
                                               const char* what) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId b = blocks[i];
    if (b < 0 || b >= pool_shape.blocks) {
      std::fprintf(stderr, "CudaModelRunner::%s: block %d of %d\n", what, b, pool_shape.blocks);
      std::abort();
    }
  }
  if (blocks.empty()) return absl::OkStatus();
  const cudaStream_t on = async ? copy_stream : stream;
  if (async) {
    // After the compute stream's work so far (what wrote or still reads the
    // blocks), before what it enqueues next.
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_ready, stream));
    KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, compute_ready, 0));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const LayerSpan payload{host[i], nullptr, 0}, block{kv_pool.get(), &pool_shape, blocks[i]};
    KV_RETURN_IF_ERROR(out ? CopyBlockLayers(payload, block, cudaMemcpyDeviceToHost, on)
                           : CopyBlockLayers(block, payload, cudaMemcpyHostToDevice, on));
  }
  if (!async) return CudaStatus(cudaStreamSynchronize(stream), what);
  cudaEvent_t done = out ? tier_exported : copies_done;
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, copy_stream));
  return CudaStatus(cudaStreamWaitEvent(stream, done, 0), what);
}

// Swap copies on the copy engines, not the SMs: per block pair one
// cudaMemcpy2DAsync over every layer (CopyBlockLayers), tails one copy per
// layer that keeps them. Ordered after the compute stream's work so far and
// before what it enqueues next.
absl::Status CudaModelRunner::Impl::SwapCopies(std::span<const BlockCopy> copies, uint8_t* src,
                                               const PoolShape& from, uint8_t* dst,
                                               const PoolShape& to, cudaMemcpyKind kind,
                                               const char* what) {
  if (copies.empty()) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_ready, stream));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, compute_ready, 0));
  for (const BlockCopy& cp : copies) {
    const auto [tail, s, d] = Localize(cp, from, to, what);
    if (!tail) {
      KV_RETURN_IF_ERROR(CopyBlockLayers({dst, &to, d}, {src, &from, s}, kind, copy_stream));
      continue;
    }
    for (int layer = 0; layer < config.num_layers; ++layer) {
      if (!formats[layer].has_tails()) continue;
      const int64_t bb = formats[layer].tail_block_bytes();
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + to.tail_offset[layer] + int64_t(d) * bb,
                                              src + from.tail_offset[layer] + int64_t(s) * bb, bb,
                                              kind, copy_stream));
    }
  }
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_done, copy_stream));
  return CudaStatus(cudaStreamWaitEvent(stream, copies_done, 0), what);
}

absl::Status CudaModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return m.RunCopies(copies, m.kv_pool.get(), m.pool_shape, m.kv_pool.get(), m.pool_shape,
                     "CopyBlocks");
}

absl::Status CudaModelRunner::SwapOut(std::span<const BlockCopy> copies) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return m.SwapCopies(copies, m.kv_pool.get(), m.pool_shape, m.swap_dev, m.swap_shape,
                      cudaMemcpyDeviceToHost, "SwapOut");
}

absl::Status CudaModelRunner::SwapIn(std::span<const BlockCopy> copies) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return m.SwapCopies(copies, m.swap_dev, m.swap_shape, m.kv_pool.get(), m.pool_shape,
                      cudaMemcpyHostToDevice, "SwapIn");
}

int64_t CudaModelRunner::tier_block_bytes() const {
  int64_t n = 0;
  for (const KvFormat& f : impl_->formats) n += f.block_bytes();
  return n;
}

absl::Status CudaModelRunner::ExportBlocks(std::span<const BlockId> blocks,
                                           std::span<uint8_t> out) {
  const int64_t per = tier_block_bytes();
  if (out.size() != blocks.size() * static_cast<size_t>(per)) {
    std::fprintf(stderr, "CudaModelRunner::ExportBlocks: %zu bytes for %zu blocks of %lld\n",
                 out.size(), blocks.size(), static_cast<long long>(per));
    std::abort();
  }
  std::vector<uint8_t*> host(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) host[i] = out.data() + i * per;
  KV_RETURN_IF_ERROR(ExportBlocksTo(blocks, host));
  return FinishExports();
}

absl::Status CudaModelRunner::ExportBlocksTo(std::span<const BlockId> blocks,
                                             std::span<uint8_t* const> out) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  if (out.size() != blocks.size()) {
    std::fprintf(stderr, "CudaModelRunner::ExportBlocksTo: %zu payloads for %zu blocks\n",
                 out.size(), blocks.size());
    std::abort();
  }
  const bool async =
      std::all_of(out.begin(), out.end(), [&](uint8_t* p) { return m.InTierArena(p); });
  return m.TierCopies(blocks, out.data(), /*out=*/true, async, "ExportBlocks");
}

absl::Status CudaModelRunner::FinishExports() {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  return CudaStatus(cudaEventSynchronize(m.tier_exported), "FinishExports");
}

absl::Status CudaModelRunner::ImportBlocks(std::span<const BlockId> blocks,
                                           std::span<const uint8_t* const> in) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  if (in.size() != blocks.size()) {
    std::fprintf(stderr, "CudaModelRunner::ImportBlocks: %zu payloads for %zu blocks\n", in.size(),
                 blocks.size());
    std::abort();
  }
  // From the arena on the copy stream; the rest (staged disk and remote
  // values, pageable) on the compute stream.
  std::vector<BlockId> ids[2];
  std::vector<uint8_t*> host[2];
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int a = m.InTierArena(in[i]) ? 1 : 0;
    ids[a].push_back(blocks[i]);
    host[a].push_back(const_cast<uint8_t*>(in[i]));
  }
  KV_RETURN_IF_ERROR(m.TierCopies(ids[1], host[1].data(), /*out=*/false, true, "ImportBlocks"));
  return m.TierCopies(ids[0], host[0].data(), /*out=*/false, false, "ImportBlocks");
}

absl::StatusOr<std::span<uint8_t>> CudaModelRunner::AllocateTierArena(int64_t bytes) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  if (m.tier_arena != nullptr) {
    return absl::FailedPreconditionError("CudaModelRunner: the tier arena is allocated once");
  }
  KV_ASSIGN_OR_RETURN(m.tier_arena, PinnedAlloc(bytes, "the host KV tier (cache.host_tier_bytes)",
                                                cudaHostAllocPortable));
  m.tier_arena_bytes = bytes;
  return std::span<uint8_t>(m.tier_arena.get(), static_cast<size_t>(bytes));
}

}  // namespace kvserve
