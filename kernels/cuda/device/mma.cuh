// Warp-level tensor-core and asynchronous-copy operations as small device
// functions, so the kernels that use them also run in the simulator
// (tests/kernels/cuda_sim/cuda_sim.h implements each one from the PTX ISA's
// fragment tables; tests/kernels/cuda_sim/mma_sim_test.cc checks them
// against a scalar reference on random tiles).
//
//   MmaF16 / MmaBf16(d, a, b)   d += a * b, mma.sync.aligned.m16n8k16.row.col
//                               .f32.{f16,bf16}.{f16,bf16}.f32: a 16x16 A
//                               tile (4 registers of two halves), a 16x8 B
//                               tile (2 registers), a 16x8 fp32 C/D tile.
//   LdmatrixX4Trans(r, row)     ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16:
//                               four 8x8 b16 matrices, lanes 8j..8j+7 naming
//                               the 16-byte rows of matrix j; r[j] of lane l
//                               holds matrix j's elements [2(l%4)][l/4] (low
//                               half) and [2(l%4)+1][l/4] (high half).
//   CpAsync16(dst, src, n)      cp.async.cg.shared.global, 16 bytes: the
//                               first n (16 or 0) from src, the rest zeros.
//   CpAsync4(dst, src, n)       cp.async.ca.shared.global, 4 bytes (n 4 or 0).
//   CpAsyncCommit()             cp.async.commit_group.
//   CpAsyncWait<N>()            cp.async.wait_group N: all but the N most
//                               recent committed groups of this thread have
//                               landed (other threads' copies need a barrier).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type"), g = lane / 4, t = lane % 4, the lower-numbered
// element in the low 16 bits of a register:
//   A: a[0] = A[g][2t, 2t+1],   a[1] = A[g+8][2t, 2t+1],
//      a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B: b[0] = B[2t, 2t+1][g],   b[1] = B[2t+8, 2t+9][g]
//   C: c[0], c[1] = C[g][2t, 2t+1];  c[2], c[3] = C[g+8][2t, 2t+1]
//
// Thread-safety: warp-collective (mma, ldmatrix: every lane of the warp
// calls them together) or per-thread (the copies) device functions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvserve::cuda::mma {

#if defined(CUDA_SIM_DYNAMIC_SHARED)

__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
  ::cuda_sim::Mma16816(d, a, b, /*bf16=*/false);
}
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  ::cuda_sim::Mma16816(d, a, b, /*bf16=*/true);
}
__device__ __forceinline__ void LdmatrixX4Trans(uint32_t (&r)[4], const void* row) {
  ::cuda_sim::LdmatrixX4Trans(r, row);
}
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  ::cuda_sim::CpAsync(dst, src, 16, src_bytes);
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, int src_bytes) {
  ::cuda_sim::CpAsync(dst, src, 4, src_bytes);
}
__device__ __forceinline__ void CpAsyncCommit() { ::cuda_sim::CpAsyncCommit(); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  ::cuda_sim::CpAsyncWait(N);
}

#else

__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void LdmatrixX4Trans(uint32_t (&r)[4], const void* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, int src_bytes) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif

}  // namespace kvserve::cuda::mma
