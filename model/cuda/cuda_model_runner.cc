// CudaModelRunner's accessors, Synchronize and ReadBlock; the runner's jobs
// are in cuda_runner_*.cc (model/cuda/cuda_runner_impl.h says which).

#include "model/cuda/cuda_model_runner.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/sizing/kv_layers.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/layers/gemm.h"
#include "model/cuda/cuda_runner_impl.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::CudaStatus;

}  // namespace

// ---- ModelRunner ---------------------------------------------------------------

const ModelConfig& CudaModelRunner::config() const { return impl_->config; }
const KvFormat& CudaModelRunner::kv_format() const { return impl_->format; }
const KvFormat& CudaModelRunner::layer_kv_format(int layer) const { return impl_->formats[layer]; }
int32_t CudaModelRunner::num_blocks() const { return impl_->num_blocks; }
int32_t CudaModelRunner::num_swap_blocks() const { return impl_->num_swap_blocks; }
int32_t CudaModelRunner::num_tail_blocks() const { return impl_->num_tails; }
bool CudaModelRunner::partial_rows_in_blocks() const { return PartialRowsInBlocks(impl_->formats); }
int32_t CudaModelRunner::num_swap_tail_blocks() const { return impl_->num_swap_tails; }
const RunnerMemoryInfo& CudaModelRunner::memory_info() const { return impl_->info; }
const CudaModelRunner::Counters& CudaModelRunner::counters() const { return impl_->counters; }
CudaModelRunner::GemmStats CudaModelRunner::gemm_stats() const {
  const cuda::Gemm& g = *impl_->gemm;
  return {g.num_plans(), g.tuned_plans(), g.memo_hits(), g.invariance_fallbacks()};
}
const std::vector<int32_t>& CudaModelRunner::graph_buckets() const { return impl_->buckets; }

absl::Status CudaModelRunner::Synchronize() {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return CudaStatus(cudaStreamSynchronize(impl_->stream), "Synchronize");
}

absl::StatusOr<std::vector<uint8_t>> CudaModelRunner::ReadBlock(int layer, int32_t block) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= m.config.num_layers || block < 0 || block >= m.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadBlock: layer ", layer, " block ", block, " is outside the pool"));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t block_bytes = m.formats[layer].block_bytes();
  std::vector<uint8_t> out(block_bytes);
  const uint8_t* src = m.kv_pool.get() + m.pool_shape.layer_offset[layer] + block * block_bytes;
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), src, out.size(), cudaMemcpyDeviceToHost, m.stream));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
  return out;
}

}  // namespace kvserve
