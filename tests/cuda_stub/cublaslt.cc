// The cuBLASLt stand-in: the calls kernels/cuda/layers/gemm.cc makes, with a
// reference GEMM (fp32 accumulation, k in order) queued on the stream like a
// kernel. It honours the descriptors gemm.cc sets: transposes, leading
// dimensions, fp32/fp16/bf16 A/B/C/D, the compute and scale types, the bias
// epilogue and beta (the residual add, C = D).
//
// Where it refuses, as the real library does (cuBLASLt documentation,
// cublasLtMatmul "Datatypes supported" and cublasLtMatmulAlgoGetHeuristic):
//   - A and B of different types, or a type pair outside the 32F-compute
//     rows of the table (32F->32F, 16F->16F/32F, 16BF->16BF/32F), or a
//     compute type other than 32F/32F_PEDANTIC/32F_FAST_TF32 with scale
//     32F: CUBLAS_STATUS_NOT_SUPPORTED from the heuristic;
//   - an epilogue other than DEFAULT and BIAS (the stand-in's limit), a
//     bias type other than D's: NOT_SUPPORTED;
//   - shapes that do not chain (op(A) m x k, op(B) k x n, C and D m x n) or a
//     leading dimension below the rows: CUBLAS_STATUS_INVALID_VALUE;
//   - a minimum alignment preference below the element size: zero
//     algorithms (found == 0), as no kernel loads a split element.
// fp8 (A and B CUDA_R_8F_E4M3; the library's other fp8 pairs, with E5M2,
// are not modelled and answer NOT_SUPPORTED), by the documentation's FP8
// requirements (cublasLtMatmul, "FP8" and its datatypes table):
//   - "A must be transposed and B non-transposed (the TN format)", the only
//     layout on compute capability 8.9 and 9.0: else NOT_SUPPORTED;
//   - compute type CUBLAS_COMPUTE_32F (not _PEDANTIC, not _FAST_TF32) and
//     scale type 32F; C = D in 16BF, 16F or 32F (the table's rows for E4M3
//     inputs; an fp8 D, which needs a D scale and amax, is not modelled);
//     the bias in 16BF for a 16BF or 32F D, in 16F for a 16F D: else
//     NOT_SUPPORTED;
//   - "all matrix dimensions must meet the optimal requirements listed in
//     Tensor Core Usage (pointers and matrix dimensions must support
//     16-byte alignment)": every leading dimension times its element size,
//     k (the contiguous dimension of A and B in TN) and m times D's
//     element size multiples of 16 bytes, else NOT_SUPPORTED; a minimum
//     alignment preference below 16 bytes gives no algorithm; a pointer
//     below 16 bytes' alignment is INVALID_VALUE at the call;
//   - scale modes (CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE): both SCALAR_32F
//     (one scale each, a device float; a null pointer means 1, as
//     documented) or both OUTER_VEC_32F (cuBLAS 12.9's channel-wise scaling
//     on Hopper: m floats for A, n for B, "each (i, j)-th element of the
//     product of A and B is multiplied by i-th element of A scale and j-th
//     element of B scale", cublasLt.h); the block modes (VEC128_32F,
//     BLK128x128_32F) and mixed pairs are not modelled: NOT_SUPPORTED. An
//     outer-vector scale pointer that is null or outside device memory is
//     INVALID_VALUE at the call (stricter than the library, which would
//     read garbage);
//   - "If set for an unsupported matrix data, scale, and compute type
//     combination" (a scale pointer on a non-fp8 GEMM) "cublasLtMatmul()
//     will return CUBLAS_INVALID_VALUE".
// The fp8 product is computed as defined: each e4m3 code decoded exactly
// (cuda_fp8.h's conversion), products and sums in fp32 in the algorithm's
// order below, then alpha * acc * scale_a[i] * scale_b[j] (+ beta C + bias),
// rounded once to D's type.
//
// The algorithm the heuristic returns records the alignment it assumes per
// matrix: the smallest of 16 bytes, the declared minimum (256 when not
// declared, the library's default) and the power of two dividing
// ld * element size; and the bias pointer's, which is why a bias epilogue
// must be asked with CUBLASLT_MATMUL_DESC_BIAS_POINTER set (the library's
// heuristic reads the descriptor's pointers for their alignment; asked
// without one, the stand-in answers INVALID_VALUE, stricter than the
// library, which would assume an alignment the later pointer may lack).
// cublasLtMatmul returns INVALID_VALUE for a pointer below what its
// algorithm assumes, or a matrix or bias outside device memory: the real
// library would fault or read the wrong bytes there.
//
// Like the library's, the heuristic's choice depends on the shape, and so
// does the order in which a dot product is summed (cuBLASLt documents no
// order; kernels differ in MMA depth and split-K): for n (D's columns, the
// rows of x in gemm.cc) <= 8 it picks a split-K of 2 over k >= 64 when the
// reduction-scheme preference allows one (the default allows all), else
// one; k is summed in chunks of 4 (n <= 8), 8 (n <= 32) or 16 (larger n),
// each chunk in order, then the chunks, then the splits. So a caller that
// asks the heuristic per row count gets other bits for the same row in a
// batch of another size, as on a device; an algorithm reused for another n
// (cublasLtMatmulAlgoCheck accepts any n) keeps its order.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/cuda_stub/cuda_stub_launch.h"

namespace {

struct Desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int bias_type = -1;                             // -1: D's type
  const void* scale_ptr[2] = {nullptr, nullptr};  // A, B
  int32_t scale_mode[2] = {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                           CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F};
};
struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Pref {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};

// What the stand-in's algorithms record (cublasLtMatmulAlgo_t::data).
// kVariant: which of the heuristic's candidates (the stand-in offers two
// that differ in nothing else, so a caller that times them and picks one
// runs the same sums whichever it picks).
enum AlgoField { kAlignA, kAlignB, kAlignC, kAlignD, kAlignBias, kSplitK, kDepth, kVariant };

Desc* D(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* L(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }
Pref* P(cublasLtMatmulPreference_t p) { return reinterpret_cast<Pref*>(p); }

int Size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    case CUDA_R_8F_E4M3:
      return 1;
    default:
      return 0;
  }
}
bool IsFp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3; }
float Load(cudaDataType_t t, const void* base, int64_t i) {
  switch (t) {
    case CUDA_R_8F_E4M3: {
      const __nv_fp8_storage_t b = static_cast<const uint8_t*>(base)[i];
      return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
    }
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}
void Store(cudaDataType_t t, void* base, int64_t i, float v) {
  switch (t) {
    case CUDA_R_16F:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}
uint32_t Pow2Dividing(uint64_t v) {
  uint32_t a = 16;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}
uint32_t AlignOf(const void* p) { return Pow2Dividing(reinterpret_cast<uintptr_t>(p)); }
bool Spans(const Layout& l, const void* p) {
  const uint64_t elems = l.cols == 0 ? 0 : static_cast<uint64_t>(l.ld) * (l.cols - 1) + l.rows;
  return p != nullptr && cuda_stub::IsDeviceRange(p, elems * Size(l.type));
}

// The fp8 rules of the top (types, TN, alignment, scale modes).
cublasStatus_t CheckFp8(const Desc& op, const Layout& a, const Layout& b, const Layout& c,
                        const Layout& d) {
  if (!IsFp8(a.type) || !IsFp8(b.type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op.compute != CUBLAS_COMPUTE_32F || op.scale != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (c.type != d.type || (d.type != CUDA_R_16BF && d.type != CUDA_R_16F && d.type != CUDA_R_32F)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (op.trans_a != CUBLAS_OP_T || op.trans_b != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op.epilogue == CUBLASLT_EPILOGUE_BIAS && op.bias_type != -1) {
    const int want = d.type == CUDA_R_16F ? CUDA_R_16F : CUDA_R_16BF;
    if (op.bias_type != want) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (op.epilogue == CUBLASLT_EPILOGUE_BIAS && op.bias_type == -1 && d.type == CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // the default (D's type) is not the table's 16BF
  }
  const int32_t ma = op.scale_mode[0], mb = op.scale_mode[1];
  const bool scalar = ma == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && mb == ma;
  const bool outer = ma == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F && mb == ma;
  if (!scalar && !outer) return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t k = a.rows, m = d.rows;  // TN: A is k x m
  if (k % 16 != 0 || (m * Size(d.type)) % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const Layout* l : {&a, &b, &c, &d}) {
    if ((static_cast<uint64_t>(l->ld) * Size(l->type)) % 16 != 0) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The shapes chain and the types are in the supported table.
cublasStatus_t Check(const Desc& op, const Layout& a, const Layout& b, const Layout& c,
                     const Layout& d) {
  if (IsFp8(a.type) || IsFp8(b.type)) {
    if (cublasStatus_t s = CheckFp8(op, a, b, c, d); s != CUBLAS_STATUS_SUCCESS) return s;
  }
  const bool fp8 = IsFp8(a.type);
  const bool compute_ok = op.compute == CUBLAS_COMPUTE_32F ||
                          op.compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                          op.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (!compute_ok || op.scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a.type != b.type || c.type != d.type || Size(a.type) == 0 || Size(c.type) == 0) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!fp8 && c.type != CUDA_R_32F && c.type != a.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (op.epilogue != CUBLASLT_EPILOGUE_DEFAULT && op.epilogue != CUBLASLT_EPILOGUE_BIAS) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!fp8 && op.epilogue == CUBLASLT_EPILOGUE_BIAS && op.bias_type != -1 &&
      op.bias_type != d.type) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = op.trans_a != CUBLAS_OP_N, tb = op.trans_b != CUBLAS_OP_N;
  const uint64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  if (k != kb || c.rows != m || c.cols != n || d.rows != m || d.cols != n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (const Layout* l : {&a, &b, &c, &d}) {
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(l->rows, 1))) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
cublasStatus_t SetField(T* field, const void* buf, size_t size) {
  if (size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete reinterpret_cast<int*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    default:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t s) { return cublasLtGetStatusName(s); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  auto* d = new Desc;
  d->compute = compute;
  d->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete D(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  Desc* d = D(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return SetField(&d->trans_a, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return SetField(&d->trans_b, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return SetField(&d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return SetField(&d->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return SetField(&d->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return SetField(&d->scale_ptr[0], buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return SetField(&d->scale_ptr[1], buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
      return SetField(&d->scale_mode[0], buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
      return SetField(&d->scale_mode[1], buf, size);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;  // not one gemm.cc sets
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete L(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete P(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  Pref* p = P(pref);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return SetField(&p->workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return SetField(&p->align[0], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return SetField(&p->align[1], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return SetField(&p->align[2], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return SetField(&p->align[3], buf, size);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return SetField(&p->reduction_mask, buf, size);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* found) {
  *found = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t s = Check(*D(op), *L(a), *L(b), *L(c), *L(d)); s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  const Desc& desc = *D(op);
  if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS && desc.bias == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;  // see the top: ask with the bias pointer set
  }
  const Layout* layouts[4] = {L(a), L(b), L(c), L(d)};
  cublasLtMatmulHeuristicResult_t r{};
  for (int i = 0; i < 4; ++i) {
    const uint32_t declared = P(pref)->align[i];
    const int es = Size(layouts[i]->type);
    if (declared < static_cast<uint32_t>(es)) return CUBLAS_STATUS_SUCCESS;  // no algorithm
    if (IsFp8(L(a)->type) && declared < 16) return CUBLAS_STATUS_SUCCESS;    // fp8: 16 bytes
    const uint32_t align = std::min({16u, declared, Pow2Dividing(layouts[i]->ld * es)});
    r.algo.data[i] = align;
  }
  r.algo.data[kAlignBias] = desc.epilogue == CUBLASLT_EPILOGUE_BIAS ? AlignOf(desc.bias) : 1;
  const bool ta = desc.trans_a != CUBLAS_OP_N;
  const uint64_t n = L(d)->cols, k = ta ? L(a)->rows : L(a)->cols;
  const bool may_split = (P(pref)->reduction_mask & CUBLASLT_REDUCTION_SCHEME_MASK) != 0;
  r.algo.data[kSplitK] = may_split && n <= 8 && k >= 64 ? 2 : 1;
  r.algo.data[kDepth] = n <= 8 ? 4 : n <= 32 ? 8 : 16;
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *found = 1;
  if (requested >= 2) {
    r.algo.data[kVariant] = 1;
    results[1] = r;
    *found = 2;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Any n: the stand-in's algorithms are not tied to a shape (the library's
// check refuses what a kernel cannot run; the caller must handle that).
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t op,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  if (algo == nullptr || result == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t s = Check(*D(op), *L(a), *L(b), *L(c), *L(d)); s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  const Layout* layouts[4] = {L(a), L(b), L(c), L(d)};
  for (int i = 0; i < 4; ++i) {
    // The algorithm's alignment must hold for this shape's leading dimension.
    const int es = Size(layouts[i]->type);
    if (Pow2Dividing(layouts[i]->ld * es) < std::min<uint32_t>(algo->data[i], 16)) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  const cublasLtMatmulAlgo_t copy = *algo;  // algo may point to result->algo
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = copy;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op_desc, const void* alpha,
                              const void* a_ptr, cublasLtMatrixLayout_t a_desc, const void* b_ptr,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c_ptr,
                              cublasLtMatrixLayout_t c_desc, void* d_ptr,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const Desc op = *D(op_desc);  // attributes are read at the call
  const Layout a = *L(a_desc), b = *L(b_desc), c = *L(c_desc), d = *L(d_desc);
  if (cublasStatus_t s = Check(op, a, b, c, d); s != CUBLAS_STATUS_SUCCESS) return s;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  int split_k = 1, depth = 1;  // no algorithm: k in order
  if (algo != nullptr) {
    const void* ptrs[4] = {a_ptr, b_ptr, c_ptr, d_ptr};
    for (int i = 0; i < 4; ++i) {
      if (AlignOf(ptrs[i]) < algo->data[i]) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (op.epilogue == CUBLASLT_EPILOGUE_BIAS && AlignOf(op.bias) < algo->data[kAlignBias]) {
      return CUBLAS_STATUS_INVALID_VALUE;  // a bias less aligned than the heuristic's
    }
    split_k = static_cast<int>(std::max<uint64_t>(algo->data[kSplitK], 1));
    depth = static_cast<int>(std::max<uint64_t>(algo->data[kDepth], 1));
  }
  const bool ta = op.trans_a != CUBLAS_OP_N, tb = op.trans_b != CUBLAS_OP_N;
  const int64_t m = static_cast<int64_t>(d.rows), n = static_cast<int64_t>(d.cols);
  const int64_t k = static_cast<int64_t>(ta ? a.rows : a.cols);
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (!Spans(a, a_ptr) || !Spans(b, b_ptr) || !Spans(d, d_ptr) ||
      (be != 0.0f && !Spans(c, c_ptr))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool bias = op.epilogue == CUBLASLT_EPILOGUE_BIAS;
  // fp8 bias is 16BF unless D is 16F (CheckFp8).
  const cudaDataType_t bias_type =
      IsFp8(a.type) && d.type == CUDA_R_32F
          ? CUDA_R_16BF
          : (op.bias_type == -1 ? d.type : cudaDataType_t(op.bias_type));
  if (bias && (op.bias == nullptr || !cuda_stub::IsDeviceRange(op.bias, m * Size(bias_type)))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool fp8 = IsFp8(a.type);
  if (fp8) {
    for (const void* ptr : {a_ptr, b_ptr, static_cast<const void*>(d_ptr)}) {
      if (AlignOf(ptr) < 16) return CUBLAS_STATUS_INVALID_VALUE;  // 16 bytes, with or without algo
    }
    if (be != 0.0f && AlignOf(c_ptr) < 16) return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!fp8 && (op.scale_ptr[0] != nullptr || op.scale_ptr[1] != nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;  // a scale on a type that takes none (see the top)
  }
  const bool outer = fp8 && op.scale_mode[0] == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const float* scale_a = static_cast<const float*>(op.scale_ptr[0]);
  const float* scale_b = static_cast<const float*>(op.scale_ptr[1]);
  for (int i = 0; i < 2; ++i) {
    const void* sp = op.scale_ptr[i];
    const int64_t count = outer ? (i == 0 ? m : n) : 1;
    if (sp == nullptr ? outer : !cuda_stub::IsDeviceRange(sp, size_t(count) * 4)) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  auto run = [=] {
    std::vector<float> out(static_cast<size_t>(m));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        // The algorithm's order: chunks of `depth` within each of
        // `split_k` ranges of k, then the ranges.
        float acc = 0.0f;
        for (int s = 0; s < split_k; ++s) {
          const int64_t p0 = k * s / split_k, p1 = k * (s + 1) / split_k;
          float part = 0.0f;
          for (int64_t q = p0; q < p1; q += depth) {
            float chunk = 0.0f;
            for (int64_t p = q; p < std::min(p1, q + depth); ++p) {
              const float av = Load(a.type, a_ptr, ta ? i * a.ld + p : p * a.ld + i);
              const float bv = Load(b.type, b_ptr, tb ? p * b.ld + j : j * b.ld + p);
              chunk += av * bv;
            }
            part += chunk;
          }
          acc += part;
        }
        float v = al * acc;
        if (scale_a != nullptr) v *= scale_a[outer ? i : 0];
        if (scale_b != nullptr) v *= scale_b[outer ? j : 0];
        if (be != 0.0f) v += be * Load(c.type, c_ptr, j * c.ld + i);  // C unread when beta is 0
        if (bias) v += Load(bias_type, op.bias, i);
        out[static_cast<size_t>(i)] = v;
      }
      // Written after the column is computed: D may be C (in place).
      for (int64_t i = 0; i < m; ++i) Store(d.type, d_ptr, j * d.ld + i, out[size_t(i)]);
    }
  };
  return cuda_stub::EnqueueOp(stream, run) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                          : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
