// QuantizeWeights: model.weight_dtype int8 / int4 applied at load, to any
// fp32 LlamaWeights whatever the checkpoint was (llama2.c, HF safetensors in
// fp32/fp16/bf16, dummy): the seven matrices of every layer and, per
// spec.head, the output head are packed into cpu::QuantMatrix
// (kernels/cpu/quant/quant_matrix.h: int8 per output channel, int4 per
// group of spec.group_size inputs). Embeddings and norms are not touched; a
// tied head gets its own quantized copy while the embedding table stays fp32.
//
// The int4 and int4_asym scale searches cost about 45 and 100 ns a weight
// on one core, minutes for an 8B model, so the blocks of each matrix are
// spread over a cpu::ThreadPool of `num_threads` (the CPU runner's
// model.threads) for the duration of the call; the packed bytes are the
// same at every thread count (tests/kernels/cpu/quant_threads_test.cc).
//
// Thread-safety: a pure function of its input; the result is immutable and
// shared read-only by the forward pass.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/quant/quant_matrix.h"
#include "model/llama_weights.h"

namespace kvserve {

struct QuantizedLinears {
  struct Layer {
    cpu::QuantMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<Layer> layers;  // empty: the body stays in fp32
  cpu::QuantMatrix output;    // empty: the head stays in fp32
  int64_t bytes() const;
  // What quantizing took, for the start-up log: weights packed, wall-clock
  // seconds and threads.
  int64_t num_weights = 0;
  double seconds = 0;
  int threads = 1;
};

// Sets weights->quantized and weights->weight_quant (the spec with its head
// resolved for the model's vocabulary). No-op for a spec that quantizes
// nothing. FailedPrecondition for weights already quantized
// differently, or with no host data (a dummy model deferred to a device).
// num_threads <= 0: one per hardware thread, as the CPU forward pass.
absl::Status QuantizeWeights(const WeightQuantSpec& spec, LlamaWeights* weights,
                             int num_threads = 1);

// The bytes of weights the CPU forward pass keeps reading per token and
// holds: the fp32 tensors that are not quantized plus the packed ones (for
// plans and memory reports; the checkpoint's own fp32 bytes may still be in
// memory beside them).
int64_t ForwardWeightBytes(const LlamaWeights& weights);
// The same for a config and a spec, without weights (kvserve plan): equal
// to ForwardWeightBytes of weights quantized with `spec`.
int64_t ForwardWeightBytesFor(const ModelConfig& config, const WeightQuantSpec& spec);

}  // namespace kvserve
