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
// The AVX2/FMA kernel is chosen at run time (cpu/cpu_features.h;
// KVSERVE_CPU_ISA=scalar forces the portable loop, which is batch-invariant
// too). Parallelism is the caller's: split rows or output features.
//
// Thread-safety: reentrant; concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>

namespace kvserve::cpu {

// y[r * ldy + o] (+)= sum_k x[r * in + k] * w[o * in + k]
//   x: [rows][in] contiguous, w: [out][in] contiguous, y: [rows][ldy], ldy >= out.
// accumulate: add into y instead of overwriting it (fuses a residual add).
void Linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y,
            int64_t ldy, bool accumulate);

// One row (a matrix-vector product), with the kernel chosen explicitly, for
// tests and for measuring which is fastest. kBest is what Linear uses.
enum class MatVecKernel { kBest, kAvx2, kScalar };
void MatVec(const float* w, const float* x, float* y, int64_t out, int64_t in, bool accumulate,
            MatVecKernel kernel = MatVecKernel::kBest);

}  // namespace kvserve::cpu
