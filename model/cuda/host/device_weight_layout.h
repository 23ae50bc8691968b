// Device weight layout: where every weight of a Llama-family model lives in
// the CUDA runner's one device allocation, and where its values come from.
// Plain C++ (no CUDA), so the arithmetic is tested on any machine.
//
// Layout: matrices row-major [out][in] (as LlamaWeights), each starting on a
// kWeightAlign boundary, in model.dtype (elem_bytes 4 or 2). The Q, K and V
// projections are one matrix wqkv = [wq; wk; wv] ([q_dim + 2 kv_dim][dim]) and
// gate/up one matrix w_gate_up = [w_gate; w_up] ([2 hidden][dim]), so each
// is a single GEMM whose output row is [q | k | v] or [gate | up]. The LM head
// aliases the embeddings when the model ties them. Variants add, per layer,
// bqkv = [bq; bk; bv] (qkv_bias), bo (o_bias) and q_norm / k_norm
// (qk_norm); absent ones have zero rows.
//
// fp8_e4m3 weights (model.weight_dtype, kernels/cuda/layers/gemm.h): each linear
// matrix (and the head, per weight_dtype_head; a tied one then gets its own
// copy beside the embeddings) is e4m3 codes [rows][ld] with ld = cols
// rounded up to kFp8InAlign (zero codes in the padding, as the fp8 GEMM's
// 16-byte rule needs), then its scales [rows] fp32 at scale_offset.
//
// Pieces: one WeightPiece per host tensor, naming its range of the arena and
// its source: fp32 host values, or (a dummy model loaded as shapes only) the
// generator stream index of its first element, or all ones (dummy norms).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"

namespace kvserve {

inline constexpr int64_t kWeightAlign = 256;

struct DeviceMatrix {
  int64_t offset = 0;  // bytes from the arena start
  int64_t rows = 0;
  int64_t cols = 0;
  // fp8_e4m3: bytes from a row to the next (0: a matrix in the dtype), and
  // where the rows' fp32 scales start.
  int64_t ld = 0;
  int64_t scale_offset = -1;
  bool fp8() const { return ld > 0; }
  int64_t numel() const { return rows * cols; }
};

struct DeviceLayerWeights {
  DeviceMatrix attn_norm;  // [1][dim]
  DeviceMatrix wqkv;       // [q_dim + 2 kv_dim][dim]
  DeviceMatrix wo;         // [dim][q_dim]
  DeviceMatrix ffn_norm;   // [1][dim]
  DeviceMatrix w_gate_up;  // [2 hidden][dim]
  DeviceMatrix w_down;     // [dim][hidden]
  DeviceMatrix bqkv;       // [1][q_dim + 2 kv_dim] when qkv_bias
  DeviceMatrix bo;         // [1][dim] when o_bias
  DeviceMatrix q_norm;     // [1][head_dim] when qk_norm
  DeviceMatrix k_norm;     // [1][head_dim] when qk_norm
};

struct DeviceWeightLayout {
  int64_t elem_bytes = 0;
  DeviceMatrix embeddings;  // [vocab][dim]
  std::vector<DeviceLayerWeights> layers;
  DeviceMatrix final_norm;  // [1][dim]
  DeviceMatrix lm_head;     // [vocab][dim]; == embeddings when tied
  int64_t total_bytes = 0;
};

// `quant` (resolved; kNone or kFp8E4m3 for the body and the head) decides
// which matrices are fp8.
DeviceWeightLayout PlanDeviceWeights(const ModelConfig& config, int64_t elem_bytes,
                                     const WeightQuantSpec& quant = {});

struct WeightPiece {
  std::string name;  // "layers.3.wk"
  int64_t numel = 0;
  int64_t dst_offset = 0;       // bytes from the arena start
  const float* host = nullptr;  // fp32 values; null when generated
  int64_t dummy_index = -1;     // generated: stream element of the first value
  bool ones = false;            // generated: all 1 (dummy norm weights)
  bool keep_fp32 = false;       // host values stored as fp32 (fp8 scales), not the dtype
  // fp8 codes instead of host: numel / cols rows of cols bytes, stored
  // dst_ld bytes apart.
  const uint8_t* codes = nullptr;
  int64_t cols = 0;
  int64_t dst_ld = 0;
  // A generated matrix the layout makes fp8 (scale_dst >= 0): the device
  // generates its rows in the dtype and quantizes them (QuantizeRowsFp8),
  // codes at dst_offset, dst_ld apart, and the rows' scales at scale_dst.
  int64_t scale_dst = -1;
};

// Every piece of `weights` in upload order (each arena byte is written by
// exactly one piece; a tied head adds none). InvalidArgument names a tensor
// whose element count disagrees with the config, or one with no data when
// the weights are not a dummy model's shapes (which have no variants).
// Matrices the layout makes fp8 come from weights.quantized's fp8 ones
// (codes and scales), which must be there (FailedPrecondition), unless the
// weights are a dummy model's shapes (generated, then quantized on the device).
absl::StatusOr<std::vector<WeightPiece>> PlanWeightPieces(const LlamaWeights& weights,
                                                          const DeviceWeightLayout& layout);

}  // namespace kvserve
