// The fp8 quantizer and GEMM on a device (tests/kernels/cuda/layers/fp8_gemm_cases.h):
// the stand-in's cases against cuBLASLt's real fp8 kernels. The GEMM's
// accumulation bound is looser than the stand-in's exact fp32: Hopper's fp8
// tensor cores keep fewer accumulator bits between promotions to fp32, so
// 2^-12 of sum |a b| is allowed (about what an fp16-precision running sum
// over a 4096-long row would lose; the stand-in's bound is in * 2^-24).
#include <catch2/catch.hpp>

#include "tests/kernels/cuda/layers/fp8_gemm_cases.h"

namespace kvserve::cuda {
namespace {

TEST_CASE("[gpu] QuantizeRowsFp8 writes the host quantizer's codes and scales", "[gpu]") {
  fp8_cases::RequireQuantizerBytes();
}

TEST_CASE("[gpu] fp8 GEMM against a float64 reference on odd shapes", "[gpu]") {
  fp8_cases::RequireFp8Gemm(0x1p-24, 0x1p-12);
}

TEST_CASE("[gpu] fp8 GEMM: fp32 logits, and one row's y in any batch", "[gpu]") {
  fp8_cases::RequireFp8LogitsInvariant(1e-3);
}

}  // namespace
}  // namespace kvserve::cuda
