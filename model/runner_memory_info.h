// RunnerMemoryInfo: what a model runner allocated (weights, activations, the
// KV pool and the swap pool, the load-time quantization), for the start-up
// log and /metrics; a small value type apart from model/model_runner.h so
// that its readers (the daemon's metrics and serving state) need not include
// the runner interface. Thread-safety: plain value.
#pragma once

#include <cstdint>
#include <string>

namespace kvserve {

// What a runner allocated, for the start-up log and /metrics.
struct RunnerMemoryInfo {
  std::string device;              // "cpu", "cuda:0 (NVIDIA H200)"
  std::string weight_dtype;        // "fp32", "bf16", ...
  int64_t weight_bytes = 0;        // model weights as the runner holds them
  int64_t activation_bytes = 0;    // measured activation peak (CUDA), or the buffers
  int64_t kv_bytes_per_block = 0;  // one block id, all layers
  int32_t num_blocks = 0;
  int64_t kv_pool_bytes = 0;   // num_blocks * kv_bytes_per_block
  int64_t kv_pool_tokens = 0;  // num_blocks * block_size
  int32_t num_swap_blocks = 0;
  std::string pool_sized_from;  // "cache.num_blocks", "cache.memory_fraction", ...
  // model.weight_dtype int8 / int4 / int4_asym (CPU) or fp8_e4m3 (CUDA, on
  // the host): what quantizing at load took (0 weights: nothing was quantized).
  int64_t quantized_weights = 0;
  double quantize_seconds = 0;
  int quantize_threads = 0;
};

}  // namespace kvserve
