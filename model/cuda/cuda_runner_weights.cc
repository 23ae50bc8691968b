// CudaModelRunner: the weights, uploaded from the host through pinned chunks
// and converted on the device, or generated in place, and the RoPE table
// (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cpu/layers/ops.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/layers/fp8_rows.h"
#include "kernels/cuda/layers/weight_init.h"
#include "kernels/random_weights.h"
#include "model/cuda/cuda_runner_impl.h"
#include "model/cuda/host/device_weight_layout.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::CudaStatus;

constexpr int64_t kGiB = int64_t{1} << 30;
// Weights are uploaded through two pinned buffers of this many floats.
constexpr int64_t kUploadChunkFloats = int64_t{16} << 20;  // 64 MiB

// Prints "\rlabel 42% (1.2 / 15.0 GiB)" on stderr for totals above 1 GiB.
class Progress {
 public:
  Progress(const char* label, int64_t total) : label_(label), total_(total) {}
  void Add(int64_t bytes) {
    done_ += bytes;
    if (total_ < kGiB) return;
    const int percent = static_cast<int>(done_ * 100 / std::max<int64_t>(total_, 1));
    if (percent == last_) return;
    last_ = percent;
    std::fprintf(stderr, "\rkvserve: %s %3d%% (%.1f / %.1f GiB)", label_, percent,
                 static_cast<double>(done_) / kGiB, static_cast<double>(total_) / kGiB);
    if (done_ >= total_) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  const char* label_;
  int64_t total_;
  int64_t done_ = 0;
  int last_ = -1;
};

}  // namespace

// ---- Weights -----------------------------------------------------------------

absl::Status CudaModelRunner::Impl::UploadWeights(const LlamaWeights& w) {
  wl = PlanDeviceWeights(config, elem, weight_quant);
  KV_ASSIGN_OR_RETURN(std::vector<WeightPiece> pieces, PlanWeightPieces(w, wl));
  KV_ASSIGN_OR_RETURN(weights, DeviceAlloc(wl.total_bytes, "the weights"));
  info.weight_bytes = wl.total_bytes;
  // Padding between matrices is zeroed so the arena's bytes are defined.
  KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(weights.get(), 0, wl.total_bytes, stream));

  int64_t host_floats = 0, generated_bytes = 0, code_bytes = 0, generated_fp8 = 0;
  for (const WeightPiece& p : pieces) {
    if (p.scale_dst >= 0) generated_fp8 = std::max(generated_fp8, p.numel);
    if (p.codes != nullptr) {
      code_bytes += p.numel;
    } else if (p.host != nullptr) {
      host_floats += p.numel;
    } else {
      generated_bytes += p.numel * elem;
    }
  }
  const bool generated = w.dummy_seed.has_value();
  const uint64_t key = generated ? DummyStreamKey(*w.dummy_seed) : 0;
  Progress progress(generated ? "generating weights" : "uploading weights",
                    host_floats * 4 + generated_bytes + code_bytes);

  HostBuffer pinned[2];
  DeviceBuffer scratch[2];
  cudaEvent_t done[2] = {nullptr, nullptr};
  const int64_t chunk = std::min<int64_t>(
      kUploadChunkFloats, std::max<int64_t>(std::max(host_floats, (code_bytes + 3) / 4), 1));
  if (host_floats > 0 || code_bytes > 0) {
    for (int i = 0; i < 2; ++i) {
      KV_ASSIGN_OR_RETURN(pinned[i], PinnedAlloc(chunk * 4, "the weight upload"));
      KV_ASSIGN_OR_RETURN(scratch[i], DeviceAlloc(chunk * 4, "the weight upload"));
      KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    }
  }
  // Generated fp8 matrices: rows in the dtype here, then quantized.
  DeviceBuffer fp8_rows;
  const int64_t fp8_rows_elems = std::min<int64_t>(kUploadChunkFloats, generated_fp8);
  if (generated_fp8 > 0) {
    KV_ASSIGN_OR_RETURN(fp8_rows, DeviceAlloc(fp8_rows_elems * elem, "the fp8 weight generation"));
  }
  auto destroy_events = [&done] {
    for (cudaEvent_t& e : done) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
  };
  absl::Status status;
  int slot = 0;
  for (const WeightPiece& p : pieces) {
    if (!status.ok()) break;
    uint8_t* dst = weights.get() + p.dst_offset;
    if (p.codes != nullptr) {
      // fp8 codes: whole rows through the pinned buffer, each stored
      // dst_ld bytes apart (the padding stays zero from the memset).
      const int64_t rows = p.numel / p.cols;
      const int64_t chunk_rows = std::max<int64_t>(chunk * 4 / p.cols, 1);
      for (int64_t r = 0; r < rows && status.ok(); r += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - r);
        status = CudaStatus(cudaEventSynchronize(done[slot]), "weight upload");
        if (!status.ok()) break;
        std::memcpy(pinned[slot].get(), p.codes + r * p.cols, n * p.cols);
        status = CudaStatus(cudaMemcpy2DAsync(dst + r * p.dst_ld, p.dst_ld, pinned[slot].get(),
                                              p.cols, p.cols, n, cudaMemcpyHostToDevice, stream),
                            "weight upload");
        if (status.ok()) status = CudaStatus(cudaEventRecord(done[slot], stream), "weight upload");
        slot ^= 1;
        progress.Add(n * p.cols);
      }
      continue;
    }
    if (p.scale_dst >= 0) {
      // Whole rows at a time: a row's scale needs all of it (stream order
      // keeps the one scratch buffer safe).
      const int64_t rows = p.numel / p.cols;
      const int64_t chunk_rows = std::max<int64_t>(fp8_rows_elems / p.cols, 1);
      for (int64_t r = 0; r < rows && status.ok(); r += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - r);
        cuda::WeightFillParams f;
        f.dst = fp8_rows.get();
        f.n = n * p.cols;
        f.dtype = act;
        f.source = cuda::WeightSource::kDummy;
        f.dummy_key = key;
        f.dummy_index = p.dummy_index + r * p.cols;
        status = cuda::FillWeights(f, stream);
        if (!status.ok()) break;
        status = cuda::QuantizeRowsFp8(
            {.x = fp8_rows.get(),
             .q = dst + r * p.dst_ld,
             .scale = reinterpret_cast<float*>(weights.get() + p.scale_dst) + r,
             .rows = n,
             .cols = p.cols,
             .ldq = p.dst_ld,
             .dtype = act},
            stream);
        progress.Add(n * p.cols * elem);
      }
      continue;
    }
    if (p.host == nullptr) {
      cuda::WeightFillParams f;
      f.dst = dst;
      f.n = p.numel;
      f.dtype = act;
      f.source = p.ones ? cuda::WeightSource::kOnes : cuda::WeightSource::kDummy;
      f.dummy_key = key;
      f.dummy_index = std::max<int64_t>(p.dummy_index, 0);
      status = cuda::FillWeights(f, stream);
      progress.Add(p.numel * elem);
      continue;
    }
    for (int64_t off = 0; off < p.numel && status.ok(); off += chunk) {
      const int64_t n = std::min(chunk, p.numel - off);
      // The pinned buffer of this slot is free once its last upload is done.
      status = CudaStatus(cudaEventSynchronize(done[slot]), "weight upload");
      if (!status.ok()) break;
      std::memcpy(pinned[slot].get(), p.host + off, n * 4);
      status = CudaStatus(cudaMemcpyAsync(scratch[slot].get(), pinned[slot].get(), n * 4,
                                          cudaMemcpyHostToDevice, stream),
                          "weight upload");
      if (!status.ok()) break;
      cuda::WeightFillParams f;
      f.dst = dst + off * (p.keep_fp32 ? 4 : elem);
      f.n = n;
      f.dtype = p.keep_fp32 ? cuda::ActDtype::kFp32 : act;
      f.source = cuda::WeightSource::kFp32;
      f.src = reinterpret_cast<const float*>(scratch[slot].get());
      status = cuda::FillWeights(f, stream);
      if (status.ok()) status = CudaStatus(cudaEventRecord(done[slot], stream), "weight upload");
      slot ^= 1;
      progress.Add(n * 4);
    }
  }
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream), "weight upload");
  destroy_events();
  KV_RETURN_IF_ERROR(status);

  // The RoPE table of the CPU backend (scaled variants included), so both
  // rotate by the very same numbers.
  const cpu::RopeTable table(config.max_position_embeddings, config.RopeInvFreq());
  const int64_t table_bytes = int64_t{table.max_positions()} * table.half_dim() * 4;
  KV_ASSIGN_OR_RETURN(rope_cos, DeviceAlloc(table_bytes, "the RoPE table"));
  KV_ASSIGN_OR_RETURN(rope_sin, DeviceAlloc(table_bytes, "the RoPE table"));
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rope_cos.get(), table.cos(0), table_bytes, cudaMemcpyHostToDevice));
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rope_sin.get(), table.sin(0), table_bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

}  // namespace kvserve
