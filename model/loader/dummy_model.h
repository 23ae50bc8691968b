// Dummy models: the exact shapes of real checkpoints filled with seeded random
// weights, for benchmarks and capacity planning without downloading weights
// (vLLM's "dummy" load format). Named "dummy:<preset>" on the command line.
//
//   tiny         dim 128, 4 layers, 8 heads / 4 kv heads, vocab 512 (a
//                stories260K-like toy that runs anywhere)
//   llama-2-7b   4096 / 11008, 32 layers, 32 heads, 32 kv, vocab 32000, 4096 pos
//   llama-2-70b  8192 / 28672, 80 layers, 64 heads,  8 kv, vocab 32000, 4096 pos
//   llama-3-8b   4096 / 14336, 32 layers, 32 heads,  8 kv, vocab 128256, 8192 pos,
//                rope_theta 500000
//   mistral-7b   4096 / 14336, 32 layers, 32 heads,  8 kv, vocab 32000, 32768 pos,
//                sliding_window 4096 (v0.1)
//   stories110m-shape  768 / 2048, 12 layers, 12 heads, 12 kv, vocab 512,
//                1024 pos: stories110M's layers with a small vocabulary, 85.7M
//                parameters (343 MB of fp32), the size at which the CPU
//                forward pass is measured (bench/README.md)
//
// Weights are drawn from an approximately normal distribution (std 0.02) by a
// counter-based generator (kernels/random_weights.h), so they depend only on
// the seed, not on how many threads fill them; norm weights are 1. Tensor j
// of the carve order (DummyTensorOffsets) holds elements [offset_j, offset_j +
// numel_j) of the stream, so a device can generate the same values in place:
// LoadDummyModelShapes gives the config and shapes without the 4 bytes per
// parameter of host memory (32 GB for llama-3-8b), for the CUDA runner. Loading refuses
// (ResourceExhausted) when the fp32 weights would exceed a byte limit, so nobody allocates 280 GB
// on a laptop by accident: KVSERVE_DUMMY_MAX_BYTES (bytes, or a size with a
// unit such as 64GiB; see util/byte_size.h), default 8 GiB.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"

namespace kvserve {

inline constexpr char kDummyPrefix[] = "dummy:";
inline constexpr uint64_t kDefaultDummyMaxBytes = uint64_t{8} << 30;
inline constexpr uint64_t kDummySeed = 0x6b7673657276ull;  // "kvserv"

// "tiny", "llama-2-7b", ...
std::vector<std::string> DummyPresetNames();

// The config of a preset, named with or without the "dummy:" prefix.
// InvalidArgument listing the presets when the name is unknown.
absl::StatusOr<ModelConfig> DummyPresetConfig(std::string_view name);

// KVSERVE_DUMMY_MAX_BYTES, or kDefaultDummyMaxBytes when unset.
absl::StatusOr<uint64_t> DummyMaxBytesFromEnv();

// Where each tensor of a dummy model starts in the generator's stream: the
// carve order tok_embeddings, per layer attn_norm wq wk wv wo ffn_norm w_gate
// w_down w_up, final_norm, output (absent when tied: output = tok_embeddings).
struct DummyLayerOffsets {
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_down, w_up;
};
struct DummyOffsets {
  int64_t tok_embeddings = 0;
  std::vector<DummyLayerOffsets> layers;
  int64_t final_norm = 0;
  int64_t output = 0;  // == tok_embeddings when tied
  int64_t total = 0;   // elements drawn, == config.NumParams()
};
DummyOffsets DummyTensorOffsets(const ModelConfig& config);

// Random weights of a preset; ResourceExhausted when they need more than
// max_bytes of fp32.
absl::StatusOr<LlamaWeights> LoadDummyModel(std::string_view name, uint64_t max_bytes,
                                            uint64_t seed = kDummySeed);
// Same, with the limit from the environment.
absl::StatusOr<LlamaWeights> LoadDummyModel(std::string_view name);

// The config and tensor shapes of a preset with no data (every Tensor::data
// null) and dummy_seed set: the runner generates the values itself. No
// memory limit applies.
absl::StatusOr<LlamaWeights> LoadDummyModelShapes(std::string_view name,
                                                  uint64_t seed = kDummySeed);

}  // namespace kvserve
