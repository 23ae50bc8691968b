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
// same at every thread count (tests/kernels/cpu/quant/quant_threads_test.cc).
//
// fp8_e4m3 (the CUDA runner's, model/model_config.h) packs the same
// matrices into Fp8Matrix on the host: per output channel, scale = absmax /
// 448 and code = e4m3(w / scale) rounded to nearest even (saturating; a
// row of zeros gets scale 0 and zero codes), the rule a checkpoint shipped
// in fp8 follows too (its weight_scale is that dequantization multiplier),
// so both reach the device as the same kind of bytes.
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

// e4m3 codes of a [rows][cols] matrix and one fp32 dequantization scale a
// row: w[r][c] ~ Fp8E4m3ToFloat(codes[r * cols + c]) * scales[r].
struct Fp8Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;  // [rows][cols]
  std::vector<float> scales;   // [rows]
  bool empty() const { return rows == 0; }
  int64_t bytes() const { return rows * cols + rows * int64_t{sizeof(float)}; }
  // Quantizes the row-major fp32 matrix by the rule above.
  static Fp8Matrix Quantize(const float* w, int64_t rows, int64_t cols);
};

struct QuantizedLinears {
  struct Layer {
    cpu::QuantMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  struct Fp8Layer {
    Fp8Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<Layer> layers;  // empty: the body stays in fp32
  cpu::QuantMatrix output;    // empty: the head stays in fp32
  // fp8_e4m3 (CUDA): the body and the head in e4m3 instead.
  std::vector<Fp8Layer> fp8_layers;
  Fp8Matrix fp8_output;
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
// differently (a checkpoint shipped in fp8 and a spec of int8, say; a
// spec of kNone keeps what was shipped), or with no host data (a dummy
// model deferred to a device).
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
// What the CUDA runner holds for fp8_e4m3 weights (kvserve plan): the e4m3
// matrices with their inputs padded to a multiple of kFp8InAlign and a
// scale a row, everything else in `act_bytes` (2: bf16 / fp16), without the
// 256-byte alignment of each matrix (model/cuda/host/device_weight_layout.h).
inline constexpr int64_t kFp8InAlign = 16;
int64_t DeviceFp8WeightBytesFor(const ModelConfig& config, const WeightQuantSpec& spec,
                                int64_t act_bytes = 2);

}  // namespace kvserve
