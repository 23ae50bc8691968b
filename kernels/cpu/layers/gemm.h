// Dense fp32 linear layers for the CPU forward pass: y = x W^T (+ y), with W
// row-major [out, in] (the PyTorch / llama2.c layout).
//
// Batch invariance: every output element is computed by the same
// instruction sequence whatever the number of rows, the tile it falls in or
// the thread that runs it (an 8-lane FMA chain over `in`, a fixed reduction
// tree, then the optional accumulate). So a sequence decodes to the same
// logits, bit for bit, alone or batched with others, in prefill or decode;
// the batching tests rely on that.
//
// Why not OpenBLAS: its kernels (and so its rounding) change with the shape,
// which would let a greedy token flip on a near tie depending on the batch;
// and on this project's CPUs it picked its generic "Prescott" SSE kernels (the
// CPUID model is unknown to it), measured 4-6x slower than the kernel here for
// one row and 2x slower for 8 and 64 rows on stories260K's matrices. It was
// dropped: 36 MB and threads started before main for no gain.
//
// The kernels are chosen at run time (cpu/cpu_features.h): AVX-512 for two
// rows or more where the CPU has it, else AVX2/FMA; KVSERVE_CPU_ISA=scalar
// forces the portable loop, which is batch-invariant too (with its own
// rounding). The AVX-512 and AVX2 kernels run the same FMA chains and the
// same reduction tree (gemm_internal.h), so they give identical bits and a
// row's result does not depend on which of them the batch size picked.
//
// Parallelism is the caller's: split rows or, better for few rows (each
// thread then streams only its part of W), output features in multiples of
// 8 (kOutputGranule); a split changes nothing in any output's arithmetic.
//
// Thread-safety: reentrant; concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>

namespace kvserve::cpu {

// The kernels, for tests and benchmarks; kBest is the run-time choice above.
enum class LinearKernel { kBest, kAvx512, kAvx2, kScalar };
// Whether this CPU can run `kernel` (kBest and kScalar always).
bool LinearKernelAvailable(LinearKernel kernel);

// Output features a parallel split should keep together: the kernels' tile.
inline constexpr int64_t kOutputGranule = 8;

// y[r * ldy + o] (+)= sum_k x[r * in + k] * w[o * in + k]
//   x: [rows][in] contiguous, w: [out][in] contiguous, y: [rows][ldy], ldy >= out.
// accumulate: add into y instead of overwriting it (fuses a residual add).
// A kernel the CPU lacks falls back to the scalar loop.
void Linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y,
            int64_t ldy, bool accumulate, LinearKernel kernel = LinearKernel::kBest);

// One row (a matrix-vector product), with the kernel chosen explicitly.
enum class MatVecKernel { kBest, kAvx2, kScalar };
void MatVec(const float* w, const float* x, float* y, int64_t out, int64_t in, bool accumulate,
            MatVecKernel kernel = MatVecKernel::kBest);

}  // namespace kvserve::cpu
