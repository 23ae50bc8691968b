// CudaModelRunner: KV eviction: a step's eviction metadata (sinks, recorded
// attention, positions past the RoPE table), slot moves and the attention
// statistics read back (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/kv/move_slots.h"
#include "kernels/paged_view.h"
#include "model/batch_check.h"
#include "model/cuda/cuda_runner_impl.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::CudaStatus;

}  // namespace

// ---- KV eviction ---------------------------------------------------------------

namespace {

// Grows `buf` to at least `bytes` (and `capacity` with it), after waiting
// for `stream` so that no queued work reads the old buffer.
absl::Status Grow(DeviceBuffer& buf, int64_t& capacity, int64_t bytes, cudaStream_t stream,
                  const char* what) {
  if (bytes <= capacity) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  buf.reset();
  capacity = 0;
  KV_ASSIGN_OR_RETURN(buf, DeviceAlloc(bytes, what));
  capacity = bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaModelRunner::Impl::PlanEviction(const BatchInput& batch) {
  const int32_t T = batch.num_tokens(), B = batch.num_seqs(), L = config.num_layers;
  const int32_t max_pos = config.max_position_embeddings;
  const int half = config.head_dim / 2;
  Eviction e;
  e.sinks =
      std::any_of(batch.num_sinks.begin(), batch.num_sinks.end(), [](int32_t n) { return n > 0; });
  e.mass = std::any_of(batch.attention_stats.begin(), batch.attention_stats.end(),
                       [](uint8_t x) { return x != 0; });
  e.rope_rows = std::any_of(batch.positions.begin(), batch.positions.end(),
                            [&](int32_t p) { return p >= max_pos; });
  e.active = e.sinks || e.mass || e.rope_rows;
  if (!e.active) {
    ev = e;
    return absl::OkStatus();
  }
  const BatchView view = ViewOf(batch);
  std::vector<int32_t> sink_pos;
  if (e.sinks) {
    sink_pos.resize(T);
    for (int32_t b = 0; b < B; ++b) {
      for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
        sink_pos[r] = view.CacheIndex(b, r);
      }
    }
    e.sink_rope_rows =
        std::any_of(sink_pos.begin(), sink_pos.end(), [&](int32_t p) { return p >= max_pos; });
  }
  // Layout of the upload, 16-byte aligned sections.
  int64_t off = 0;
  auto section = [&](int64_t bytes) {
    const int64_t at = off;
    off += Align16(bytes);
    return at;
  };
  if (e.sinks) {
    e.num_sinks_off = section(int64_t{B} * 4);
    e.sink_pos_off = section(int64_t{T} * 4);
  }
  if (e.mass) {
    e.mass_offset_off = section(int64_t{T} * 8);
    e.stats_offset_off = section(int64_t{L} * B * 8);
  }
  if (e.rope_rows) e.rope_off = section(int64_t{T} * half * 8);
  if (e.sink_rope_rows) e.sink_rope_off = section(int64_t{T} * half * 8);
  ev_scratch.assign(off, 0);
  uint8_t* base = ev_scratch.data();
  if (e.sinks) {
    int32_t* ns = reinterpret_cast<int32_t*>(base + e.num_sinks_off);
    for (int32_t b = 0; b < B; ++b) ns[b] = std::max(0, batch.num_sinks[b]);
    std::memcpy(base + e.sink_pos_off, sink_pos.data(), int64_t{T} * 4);
  }
  if (e.mass) {
    // As the CPU runner (model/cpu/cpu_forward.cc PlanEviction): each recorded
    // row's keys in row order; each recorded sequence's [L][context_len].
    int64_t* mo = reinterpret_cast<int64_t*>(base + e.mass_offset_off);
    int64_t* so = reinterpret_cast<int64_t*>(base + e.stats_offset_off);
    std::fill(mo, mo + T, int64_t{-1});
    std::fill(so, so + int64_t{L} * B, int64_t{-1});
    for (int32_t b = 0; b < static_cast<int32_t>(batch.attention_stats.size()); ++b) {
      if (batch.attention_stats[b] == 0) continue;
      for (int32_t r = batch.query_start[b]; r < batch.query_start[b + 1]; ++r) {
        mo[r] = e.num_keys;
        e.num_keys += NumKeys(view.CacheIndex(b, r), config.sliding_window);
      }
      for (int32_t l = 0; l < L; ++l) {
        so[int64_t{l} * B + b] = e.num_stats + int64_t{l} * batch.context_len[b];
      }
      e.num_stats += int64_t{L} * batch.context_len[b];
    }
  }
  // cos/sin rows for positions past the table, as the CPU's RopeAt: the
  // angle in float, then cosf / sinf.
  auto rope_rows = [&](int64_t at, auto pos_of) {
    float* cs = reinterpret_cast<float*>(base + at);
    float* sn = cs + int64_t{T} * half;
    for (int32_t t = 0; t < T; ++t) {
      const int32_t pos = pos_of(t);
      if (pos < max_pos) continue;
      for (int j = 0; j < half; ++j) {
        const float val = static_cast<float>(pos) * inv_freq[j];
        cs[int64_t{t} * half + j] = cosf(val);
        sn[int64_t{t} * half + j] = sinf(val);
      }
    }
  };
  if (e.rope_rows) rope_rows(e.rope_off, [&](int32_t t) { return batch.positions[t]; });
  if (e.sink_rope_rows) rope_rows(e.sink_rope_off, [&](int32_t t) { return sink_pos[t]; });

  // Device buffers (first eviction step, then growth).
  if (e.sinks && sink_q == nullptr) {
    KV_ASSIGN_OR_RETURN(sink_q,
                        DeviceAlloc(int64_t{max_tokens} * qkv_dim * elem, "the sink queries"));
  }
  if (e.mass) {
    if (softmax_stats == nullptr) {
      KV_ASSIGN_OR_RETURN(softmax_stats, DeviceAlloc(int64_t{max_tokens} * config.num_heads * 2 * 4,
                                                     "the attention softmax statistics"));
    }
    KV_RETURN_IF_ERROR(Grow(key_mass, key_mass_capacity, std::max<int64_t>(e.num_keys, 1) * 4,
                            stream, "the attention key mass"));
    KV_RETURN_IF_ERROR(Grow(attn_stats, attn_stats_capacity, std::max<int64_t>(e.num_stats, 1) * 4,
                            stream, "the attention statistics"));
  }
  if (off > ev_capacity) {
    const int64_t cap = std::max<int64_t>(off * 2, 4096);
    KV_RETURN_IF_ERROR(
        ReallocateUpload(ev_host, ev_dev, ev_capacity, cap, cap, "the eviction staging"));
  }
  // The previous eviction upload must have left the pinned buffer.
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev_uploaded));
  std::memcpy(ev_host.get(), base, off);
  if (off > 0) {
    KV_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ev_dev.get(), ev_host.get(), off, cudaMemcpyHostToDevice, stream));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_uploaded, stream));
  ev = e;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::RunMoves(std::span<const SlotMove> moves) {
  if (moves.empty()) return absl::OkStatus();
  CheckSlotMoves(moves, int64_t{num_blocks} * format.block_size(), "CudaModelRunner::MoveSlots");
  // The copy list buffers carry the moves: one move is two int32 pairs' bytes.
  const int64_t n = static_cast<int64_t>(moves.size());
  static_assert(sizeof(SlotMove) == 16);
  KV_RETURN_IF_ERROR(EnsureCopyCapacity(2 * n));
  KV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copies_uploaded));
  std::memcpy(copies_host.get(), moves.data(), cuda::MoveListBytes(n));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies_dev.get(), copies_host.get(),
                                          cuda::MoveListBytes(n), cudaMemcpyHostToDevice, stream));
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_uploaded, stream));
  cuda::MoveSlotsParams p;
  p.pool = kv_pool.get();
  p.num_layers = config.num_layers;
  p.num_blocks = num_blocks;
  p.layout = format.layout();
  p.moves = reinterpret_cast<const int64_t*>(copies_dev.get());
  p.num_moves = static_cast<int32_t>(n);
  return cuda::MoveSlots(p, stream);
}

// Slot moves (cuda::MoveSlots) take one page layout for every layer: one
// per-token dtype throughout, no int4_kc tails.
bool CudaModelRunner::supports_eviction() const {
  const Impl& m = *impl_;
  if (m.has_tails) return false;
  for (const KvFormat& f : m.formats) {
    if (f.dtype() != m.format.dtype()) return false;
  }
  return true;
}

absl::Status CudaModelRunner::MoveSlots(std::span<const SlotMove> moves) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  if (!supports_eviction()) {
    return absl::UnimplementedError(
        "KV slot moves need one per-token cache.kv_dtype in every layer (no int4_kc)");
  }
  return m.RunMoves(moves);
}

absl::Status CudaModelRunner::ReadAttentionStats(std::span<float> out) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t n = m.ev.active && m.ev.mass ? m.ev.num_stats : 0;
  if (static_cast<int64_t>(out.size()) < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention stats buffer has ", out.size(), " floats, the batch recorded ", n));
  }
  if (n == 0) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), m.attn_stats.get(), n * 4, cudaMemcpyDeviceToHost, m.stream));
  return CudaStatus(cudaStreamSynchronize(m.stream), "ReadAttentionStats");
}

}  // namespace kvserve
