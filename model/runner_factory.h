// CreateModelRunner: the one place that turns model.device into a backend.
//   cpu          CpuModelRunner (fp32 weights, or int8 / int4 linear layers
//                per model.weight_dtype, host KV pool)
//   cuda, cuda:N CudaModelRunner on device N (0 for "cuda"): weights in
//                model.dtype, one cudaMalloc'd KV pool sized after a profile
//                forward, pinned swap pool, CUDA graphs for decode
// A build without CUDA, or a machine without the device, is a start-up error
// that names model.device. The KV pool is sized by cache/sizing/kv_pool_plan.h: on
// the CPU from cache.num_blocks / memory_bytes / memory_fraction (of
// MemAvailable after the weights) or the default of max_num_seqs sequences
// capped at kDefaultCpuKvBudget; on CUDA the same keys with memory_fraction
// defaulting to 0.9 of the device memory left after weights and activations.
//
// Example:
//   RunnerOptions opt = ...;  // from ServeConfig
//   KV_ASSIGN_OR_RETURN(LoadedModel m,
//                       LoadModel(path, tok, RunnerDefersDummyWeights(opt)));
//   KV_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> r,
//                       CreateModelRunner(std::move(m.weights), opt));
//
// RunnerOptions names the KV format as a KvDtypeSpec (cache/format/kv_dtype_spec.h:
// its parser, KvDtype and the dtype names); front ends reach those through
// this header rather than including cache/.
//
// Thread-safety: a pure function; may take seconds (weights are uploaded,
// graphs captured).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/format/kv_cross_layer.h"
#include "cache/format/kv_dtype_spec.h"
#include "cache/format/kv_format.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace kvserve {

inline constexpr int64_t kDefaultCpuKvBudget = int64_t{4} << 30;
inline constexpr double kDefaultCudaMemoryFraction = 0.9;

struct DeviceSpec {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;  // CUDA device number
};

// "cpu", "cuda" (device 0) or "cuda:N"; InvalidArgument naming model.device.
absl::StatusOr<DeviceSpec> ParseDevice(std::string_view text);

// model.dtype of the weights and activations: "auto" is fp32 on the CPU,
// bf16 on CUDA.
enum class WeightDtype : uint8_t { kFp32, kFp16, kBf16 };
std::string_view WeightDtypeName(WeightDtype dtype);
// "auto", "fp32", "fp16", "bf16" (also float32 / float16 / bfloat16);
// InvalidArgument naming model.dtype. auto resolves per device.
absl::StatusOr<WeightDtype> ResolveWeightDtype(std::string_view text, const DeviceSpec& device);

struct RunnerOptions {
  std::string device = "cpu";  // model.device
  std::string dtype = "auto";  // model.dtype
  // model.weight_dtype, model.weight_dtype_head, model.weight_group_size
  // (ParseWeightQuant in model/model_config.h): int8 / int4 quantize the
  // CPU runner's linear layers at load; CUDA refuses them.
  std::string weight_dtype = "auto";
  std::string weight_dtype_head = "auto";
  int32_t weight_group_size = 32;
  bool cuda_graphs = true;  // model.cuda_graphs
  // model.attention_kernel (CUDA): "fast" (the tensor-core kernel where it takes
  // the layout) or "reference" (the simple kernel; kernels/cuda/attention/paged_attention.h).
  std::string attention_kernel = "fast";
  // cache.*
  KvDtypeSpec kv_dtype = KvDtype::kFp32;  // one dtype or one per layer
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  int64_t memory_bytes = 0;
  double memory_fraction = 0.0;  // 0: the backend's default
  int32_t num_swap_blocks = 0;
  int32_t int4_group_size = 64;
  // cache.low_rank: a `kvserve calibrate-kv` file; the CPU runner caches
  // rank-R latents (model/lowrank/low_rank_kv.h), CUDA refuses it. "": off.
  std::string low_rank;
  // cache.cross_layer (cache/format/kv_cross_layer.h): the CPU runner shares
  // one stored direction per token between pairs of layers; CUDA refuses
  // it. from_layer -1: off.
  KvCrossLayerSpec cross_layer;
  // scheduler.* (the largest step the runner must take)
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 512;
  int32_t max_model_len = 0;  // 0: the model's
  // CPU forward threads; <= 0: one per hardware thread.
  int num_threads = 0;
};

// OK when model.device can be used here (always for cpu); otherwise the
// start-up error naming model.device: no CUDA in this build, no device, no
// device N. Cheap: call it before loading gigabytes of weights.
absl::Status CheckRunnerDevice(const RunnerOptions& options);

// True when `options` name a device that generates dummy weights itself
// (CUDA), so LoadModel may skip materializing them on the host.
bool RunnerDefersDummyWeights(const RunnerOptions& options);

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(LlamaWeights weights,
                                                               const RunnerOptions& options);

}  // namespace kvserve
