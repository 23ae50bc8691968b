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
//
// Weights are drawn from an approximately normal distribution (std 0.02) by a
// counter-based generator, so they depend only on the seed, not on how many
// threads fill them; norm weights are 1. Loading refuses (ResourceExhausted)
// when the fp32 weights would exceed a byte limit, so nobody allocates 280 GB
// on a laptop by accident: KVSERVE_DUMMY_MAX_BYTES (bytes, or a size with a
// unit such as 64GiB; see cache/capacity_plan.h), default 8 GiB.
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

// Random weights of a preset; ResourceExhausted when they need more than
// max_bytes of fp32.
absl::StatusOr<LlamaWeights> LoadDummyModel(std::string_view name, uint64_t max_bytes,
                                            uint64_t seed = kDummySeed);
// Same, with the limit from the environment.
absl::StatusOr<LlamaWeights> LoadDummyModel(std::string_view name);

}  // namespace kvserve
