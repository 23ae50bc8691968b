// kernels/cuda/layers/: the forward pass's kernels outside attention: GEMMs
// (cuBLASLt, fp8 rows), RMSNorm, RoPE, SwiGLU, embedding and weight init.
//
// Dense GEMMs of the CUDA forward pass through cuBLASLt: y = x W^T (+ y),
// with W row-major [out][in] as the weights are stored (model/llama_weights.h,
// model/cuda/host/device_weight_layout.h), x [rows][ldx], y [rows][ldy].
//
// Types: x and W share the model dtype (ActDtype). bf16 / fp16 multiply on
// tensor cores with fp32 accumulation; fp32 uses CUBLAS_COMPUTE_32F_PEDANTIC
// where cuBLASLt has an algorithm for it, else CUBLAS_COMPUTE_32F (neither
// uses TF32), and no split-K reductions, so the reference dtype is as close
// to the CPU's arithmetic as a GPU gets. y
// is the model dtype or fp32 (the LM head writes fp32 logits for sampling).
// accumulate adds into y in the epilogue (beta = 1, C = D): the residual
// add of the O and down projections costs no extra pass. bias (Qwen2's q/k/v
// biases, Llama's attention_bias) is added in the epilogue too:
// y = x W^T (+ y) + bias, rounded once.
//
// fp8 weights (w_scale set, model.weight_dtype fp8_e4m3): W is e4m3 codes
// with one fp32 dequantization scale per output channel and x is e4m3 with
// one per row (QuantizeRowsFp8, kernels/cuda/layers/fp8_rows.h, writes both), so
//   y[r][o] = round(x_scale[r] * w_scale[o] * sum_k x[r][k] W[o][k] (+ y) + bias)
// on fp8 tensor cores with fp32 accumulation, y in the Gemm's dtype (bf16 or
// fp16; an fp32 Gemm takes no fp8) or fp32. Both scales are cuBLASLt's
// outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on A and
// B: a vector of m = out and n = rows scales, Hopper since cuBLAS 12.9), so
// the per-channel weight and per-token activation scales cost no extra pass
// and a row's y depends on that row alone (batch invariance, below). The
// fp8 kernels' requirements (cuBLASLt documentation, cublasLtMatmul, "FP8"):
// A transposed and B not ("TN", the only layout on compute capability 8.9
// and 9.0, which is this layout), compute type 32F with scale type 32F, and
// 16-byte alignment of the pointers and the matrices' leading dimensions: in
// and ldx multiples of 16 (pad the inputs with zero codes), y's rows 16-byte
// aligned.
//
// cuBLASLt in row-major terms: y^T = W x^T in column-major, i.e. D (out x
// rows, ld ldy) = op(A) B with A = W seen as column-major [in x out] (lda =
// in, transposed) and B = x seen as column-major [in x rows] (ldb = ldx).
//
// Algorithms: cublasLtMatmulAlgoGetHeuristic once per (in, out, ldx, ldy, y
// dtype, bias or not, pointer alignments, the bias's included), asked at
// kPlanRows rows with the bias pointer set (the heuristic reads its
// alignment) and no split-K or other reduction scheme, for every dtype: up
// to kTuneCandidates of its candidates are timed at kTuneRows rows (1, 64
// and 512: decode and prefill) on the Linear call's stream (scratch x and y,
// the real weights) and the one least slower than the fastest at each count
// is kept; the process remembers the pick per device and shape, so every
// Gemm of the process runs the same algorithm for a shape. (The heuristic's
// first was a 16-CTA kernel for Llama-3-8B's down projection on an H200,
// 0.32 ms a call at 1 row, 8x the read-bandwidth time.) While the stream is
// capturing a graph, the heuristic's first is taken untimed. That one
// algorithm then runs every row count (cublasLtMatmulAlgoCheck, once per
// count). Batch invariance: a row's y is the same bits whatever rows are
// batched with it, eager or in a graph bucket, since the algorithm (and so
// the order its kernel sums k in) does not depend on the row count; asking
// per row count, as before, picked split-K for small batches and other
// kernels for others. Where the check refuses a row count, that count gets
// its own algorithm (invariance_fallbacks()). Descriptors are cached, so a
// steady decode loop makes no heuristic query, and every call is CUDA-graph
// capturable (the workspace is the Gemm's own, allocated once).
//
// Example:
//   KV_ASSIGN_OR_RETURN(std::unique_ptr<Gemm> gemm, Gemm::Create(ActDtype::kBf16));
//   GemmParams p{.x = h, .w = wqkv, .y = qkv, .rows = T, .in = dim, .out = qkv_dim};
//   KV_RETURN_IF_ERROR(gemm->Linear(p, stream));
//
// Thread-safety: one Gemm per stream-owning thread (the plan cache is not
// locked); calls only enqueue work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

struct GemmParams {
  const void* x = nullptr;  // [rows][ldx], the Gemm's dtype, device
  const void* w = nullptr;  // [out][in], the Gemm's dtype, device
  void* y = nullptr;        // [rows][ldy], y_dtype, device
  int64_t rows = 0;
  int64_t in = 0;
  int64_t out = 0;
  int64_t ldx = 0;  // elements; 0: in
  int64_t ldy = 0;  // elements; 0: out
  bool accumulate = false;
  const void* bias = nullptr;          // [out], y_dtype, device; null: none
  ActDtype y_dtype = ActDtype::kFp32;  // the Gemm's dtype, or fp32
  // fp8 weights (see the top): set, w is e4m3 [out][in] and x e4m3
  // [rows][ldx] (bytes), each with its scales; null, both are the Gemm's dtype.
  const float* w_scale = nullptr;  // [out], device
  const float* x_scale = nullptr;  // [rows], device; needed with w_scale
};

class Gemm {
 public:
  static constexpr int64_t kDefaultWorkspaceBytes = int64_t{32} << 20;

  // Creates the cuBLASLt handle and the workspace on the current device.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(
      ActDtype dtype, int64_t workspace_bytes = kDefaultWorkspaceBytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  ActDtype dtype() const { return dtype_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // The row count the heuristic is asked at (a middle batch: its kernels
  // serve decode and prefill rows alike).
  static constexpr int64_t kPlanRows = 64;

  // Shapes with a cached algorithm (one per shape, whatever the row counts).
  int64_t num_plans() const { return static_cast<int64_t>(plans_.size()); }
  // Row counts that cuBLASLt refused to run with their shape's algorithm.
  int64_t invariance_fallbacks() const { return invariance_fallbacks_; }
  // Plans whose algorithm this Gemm picked by timing the heuristic's
  // candidates, and plans that took the process's earlier pick.
  int64_t tuned_plans() const { return tuned_plans_; }
  int64_t memo_hits() const { return memo_hits_; }

  // InvalidArgument naming the field for a bad shape, stride, dtype or null
  // pointer; NotFound when cuBLASLt has no algorithm for the shape; else the
  // status of the enqueue. rows == 0 does nothing.
  absl::Status Linear(const GemmParams& params, cudaStream_t stream);

 private:
  struct Plan;
  // in, out, ldx, ldy, y dtype, bias, alignment of x, w, y and of the bias
  // (0: none), fp8 weights; not the row count.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool, int, int, int, int, bool>;

  Gemm(ActDtype dtype, void* handle, void* workspace, int64_t workspace_bytes);
  // `p`'s bias and fp8 scale pointers are the descriptor's while the
  // heuristic is asked (it may read their alignment).
  absl::StatusOr<Plan*> PlanFor(const Key& key, const GemmParams& p, cudaStream_t stream);
  // Descriptors and the algorithm for one compute type
  // (cublasComputeType_t): the heuristic's fastest candidate on `stream`.
  absl::StatusOr<std::unique_ptr<Plan>> MakePlan(const Key& key, int compute_type,
                                                 const GemmParams& p, cudaStream_t stream);
  // The index of plan.candidates with the least sum over kTuneRows of its
  // time against the fastest candidate's (kTuneRuns calls of each after one
  // warm-up, scratch x and y, the real weights): decode and prefill rows
  // both count. nullopt while `stream` is capturing or on any failure.
  std::optional<int> Fastest(Plan& plan, const Key& key, const GemmParams& p, cudaStream_t stream);
  static constexpr int kTuneCandidates = 8;
  static constexpr int64_t kTuneRows[] = {1, 64, 512};
  static constexpr int64_t kTuneScratchBytes = int64_t{64} << 20;
  static constexpr int kTuneRuns = 3;
  // The x/y layouts of `rows` rows and the algorithm they run with.
  struct PlanRows;
  absl::StatusOr<const PlanRows*> RowsFor(Plan& plan, const Key& key, int64_t rows);

  ActDtype dtype_;
  void* handle_;  // cublasLtHandle_t
  void* workspace_;
  int64_t workspace_bytes_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  int64_t invariance_fallbacks_ = 0;
  int64_t tuned_plans_ = 0;
  int64_t memo_hits_ = 0;
};

}  // namespace kvserve::cuda
