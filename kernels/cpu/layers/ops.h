// Small elementwise and per-row ops of the Llama forward pass on the CPU:
// embedding lookup, RMSNorm, RoPE (interleaved and neox), SwiGLU.
//
// RMSNorm and the RoPE tables follow llama2.c's run.c operation for
// operation (float accumulation in order, 1/sqrtf, powf/cosf/sinf in float);
// with the other ops within an ulp or two of it, greedy decoding reproduces
// its text exactly.
//
// Thread-safety: pure functions over caller-owned buffers; RopeTable is
// immutable after construction.
#pragma once

#include <cstdint>
#include <vector>

namespace kvserve::cpu {

// out[t][:] = table[ids[t]][:]; ids must be in range (the caller checks).
void Embedding(const float* table, const int32_t* ids, int64_t rows, int64_t dim, float* out);

// out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), per row of `dim`.
// out may alias x.
void RmsNorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps);

// cos/sin of pos * theta^(-2j/head_dim) for pos < max_positions, j < head_dim/2.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int max_positions, int head_dim, float theta);
  // From explicit inverse frequencies [head_dim / 2] (scaled RoPE variants).
  RopeTable(int max_positions, const std::vector<float>& inv_freq);

  int max_positions() const { return max_positions_; }
  int half_dim() const { return half_; }
  const float* cos(int pos) const { return cos_.data() + static_cast<int64_t>(pos) * half_; }
  const float* sin(int pos) const { return sin_.data() + static_cast<int64_t>(pos) * half_; }

 private:
  int max_positions_ = 0;
  int half_ = 0;
  std::vector<float> cos_;  // [max_positions][head_dim / 2]
  std::vector<float> sin_;
};

// y[r][:] += bias[:] for rows of `dim` values.
void AddBias(float* y, const float* bias, int64_t rows, int64_t dim);

// Rotates every head of one row in place: vec is [num_heads][head_dim].
// interleaved (llama2.c) pairs channels (2j, 2j+1); otherwise (neox, HF
// rotate-half) pairs (j, j + head_dim/2).
void ApplyRope(float* vec, int num_heads, int head_dim, const float* cos, const float* sin,
               bool interleaved);

// gate[i] = silu(gate[i]) * up[i], in place in gate. The AVX2 path computes
// e^x with a polynomial (about 1 ulp from libm's expf) and treats a partial
// last vector like a full one, so an element's result never depends on its
// offset in the array.
void SiluMul(float* gate, const float* up, int64_t n);

}  // namespace kvserve::cpu
