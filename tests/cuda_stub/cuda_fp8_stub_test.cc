// fp8_e4m3 weights through the stand-in (kernels/cuda/layers/fp8_rows.h,
// kernels/cuda/layers/gemm.h, tests/cuda_stub/cublaslt.cc): the quantizer and GEMM
// cases of tests/kernels/cuda/layers/fp8_gemm_cases.h with the stand-in's exact
// fp32 accumulation bound, and what the stand-in refuses as the library
// does (not TN, a leading dimension off 16 bytes, mixed scale modes, a
// compute type other than 32F, an fp8 D) and what Gemm refuses with the
// field named.
#include <cublasLt.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/kernels/cuda/layers/fp8_gemm_cases.h"

namespace kvserve::cuda {
namespace {

using fp8_cases::Upload;

TEST_CASE("QuantizeRowsFp8 writes the host quantizer's codes and scales",
          "[cuda_stub][fiber_order]") {
  fp8_cases::RequireQuantizerBytes();
}

// The stand-in sums in fp32, in order: in * 2^-24 of sum |a b|.
TEST_CASE("fp8 GEMM against a float64 reference on odd shapes", "[cuda_stub][fiber_order]") {
  fp8_cases::RequireFp8Gemm(0x1p-24, 0.0);
}

TEST_CASE("fp8 GEMM: fp32 logits, and one row's y in any batch", "[cuda_stub]") {
  fp8_cases::RequireFp8LogitsInvariant(1e-5);
}

TEST_CASE("fp8 GEMM: what cuBLASLt and Gemm refuse", "[cuda_stub]") {
  const int64_t in = 32, out = 16, rows = 2;
  uint8_t* dw = Upload(std::vector<uint8_t>(static_cast<size_t>(out * in), 0x38));
  uint8_t* dx = Upload(std::vector<uint8_t>(static_cast<size_t>(rows * in), 0x38));
  float* ws = Upload(std::vector<float>(out, 1.0f));
  float* xs = Upload(std::vector<float>(rows, 1.0f));
  uint16_t* dy = Upload(std::vector<uint16_t>(static_cast<size_t>(rows * out), 0));

  SECTION("the stand-in") {
    cublasLtHandle_t h;
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    // An fp8 descriptor: TN, outer-vector scales, bf16 D; `mutate` changes one thing.
    auto heuristic = [&](auto mutate) {
      cublasLtMatmulDesc_t op;
      cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, mode_b = mode_a;
      int64_t lda = in, ldb = in;
      cudaDataType_t d_type = CUDA_R_16BF;
      mutate(compute, ta, mode_b, lda, d_type);
      REQUIRE(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a,
                                     sizeof(mode_a));
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b,
                                     sizeof(mode_b));
      cublasLtMatrixLayout_t a, b, c;
      const bool t = ta == CUBLAS_OP_T;
      cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, t ? in : out, t ? out : in, lda);
      cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, in, rows, ldb);
      cublasLtMatrixLayoutCreate(&c, d_type, out, rows, out);
      cublasLtMatmulPreference_t pref;
      cublasLtMatmulPreferenceCreate(&pref);
      cublasLtMatmulHeuristicResult_t r{};
      int found = 0;
      const cublasStatus_t s =
          cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &found);
      for (auto l : {a, b, c}) cublasLtMatrixLayoutDestroy(l);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatmulDescDestroy(op);
      return s == CUBLAS_STATUS_SUCCESS && found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : s;
    };
    auto none = [](auto&...) {};
    REQUIRE(heuristic(none) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(heuristic([](auto&, cublasOperation_t& ta, auto&...) { ta = CUBLAS_OP_N; }) ==
            CUBLAS_STATUS_NOT_SUPPORTED);
    REQUIRE(heuristic([](cublasComputeType_t& c, auto&...) { c = CUBLAS_COMPUTE_32F_PEDANTIC; }) ==
            CUBLAS_STATUS_NOT_SUPPORTED);
    REQUIRE(heuristic([](auto&, auto&, int32_t& mode_b, auto&...) {
              mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
            }) == CUBLAS_STATUS_NOT_SUPPORTED);
    REQUIRE(heuristic([](auto&, auto&, auto&, int64_t& lda, auto&) { lda = in + 8; }) ==
            CUBLAS_STATUS_NOT_SUPPORTED);
    REQUIRE(heuristic([](auto&, auto&, auto&, auto&, cudaDataType_t& d) { d = CUDA_R_8F_E4M3; }) ==
            CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtDestroy(h);
  }
  SECTION("Gemm names the field") {
    auto bf16 = Gemm::Create(ActDtype::kBf16);
    auto fp32 = Gemm::Create(ActDtype::kFp32);
    REQUIRE((bf16.ok() && fp32.ok()));
    GemmParams p{.x = dx,
                 .w = dw,
                 .y = dy,
                 .rows = rows,
                 .in = in,
                 .out = out,
                 .y_dtype = ActDtype::kBf16,
                 .w_scale = ws,
                 .x_scale = xs};
    REQUIRE((*bf16)->Linear(p, nullptr).ok());
    GemmParams q = p;
    q.y_dtype = ActDtype::kFp32;
    REQUIRE((*fp32)->Linear(q, nullptr).message() ==
            "Gemm: fp8 weights need a bf16 or fp16 Gemm (cuBLASLt's fp8 GEMMs take no fp32 "
            "activations)");
    q = p;
    q.in = 24;
    q.ldx = 32;
    REQUIRE((*bf16)->Linear(q, nullptr).message() ==
            "Gemm: in (fp8) must be a multiple of 16, got 24");
    q = p;
    q.x_scale = nullptr;
    REQUIRE((*bf16)->Linear(q, nullptr).message() == "Gemm: x_scale is null (fp8 weights)");
    q = p;
    q.w_scale = nullptr;
    REQUIRE((*bf16)->Linear(q, nullptr).message() == "Gemm: x_scale without w_scale");
    // y rows of 12 bf16 (24 bytes) break the 16-byte rule: cuBLASLt has no kernel.
    q = p;
    q.out = 12;
    const absl::Status s = (*bf16)->Linear(q, nullptr);
    REQUIRE(s.code() == absl::StatusCode::kNotFound);
    REQUIRE(s.message().find("CUBLAS_STATUS_NOT_SUPPORTED") != std::string_view::npos);
  }
  for (void* ptr : std::initializer_list<void*>{dw, dx, ws, xs, dy}) cudaFree(ptr);
}

}  // namespace
}  // namespace kvserve::cuda
