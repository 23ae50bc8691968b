// Which CPU instruction set the kernels use, decided once at run time.
//
// The AVX2 kernels need AVX2, FMA and F16C (every AVX2 CPU made so far has
// all three); anything else runs the portable scalar code. KVSERVE_CPU_ISA
// overrides the choice for the whole process: `scalar` forces the fallback
// (to compare paths or to debug), `avx2` insists on AVX2 and aborts where the
// CPU lacks it, `auto` (or unset) takes the best available. Kernel parameter
// structs carry a CpuIsa too, so tests can run both paths side by side.
//
// Thread-safety: detection runs once (thread-safe static); all functions are
// pure afterwards.
#pragma once

#include <string_view>

namespace kvserve::cpu {

enum class CpuIsa : unsigned char { kAuto, kScalar, kAvx2 };

std::string_view CpuIsaName(CpuIsa isa);

// True when the CPU can run the AVX2 kernels (AVX2 + FMA + F16C).
bool CpuHasAvx2();

// True when the CPU has AVX-512 F, BW, VL and VNNI (vpdpbusd), which the
// int8/int4 weight GEMMs (kernels/cpu/quant/) use; implies CpuHasAvx2().
bool CpuHasAvx512Vnni();

// Whether the AVX-512 kernels (the VNNI weight GEMMs) may run: the CPU has
// AVX-512 VNNI and KVSERVE_CPU_ISA (env_value; null: unset) is unset, empty
// or `auto`. `avx2` and `scalar` pin the whole process below AVX-512, so a
// comparison run at `avx2` runs the AVX2 weight GEMMs too.
bool Avx512AllowedFor(const char* env_value);
// Avx512AllowedFor(getenv("KVSERVE_CPU_ISA")), decided once.
bool Avx512Allowed();

// The process default: KVSERVE_CPU_ISA if set, else the best available.
// Never kAuto. An unknown KVSERVE_CPU_ISA value, or `avx2` on a CPU without
// it, aborts with a message (a misconfigured host should not silently run a
// different path than asked).
CpuIsa DefaultCpuIsa();

// kAuto -> DefaultCpuIsa(); kAvx2 on a CPU without AVX2 -> kScalar; else
// unchanged.
CpuIsa ResolveCpuIsa(CpuIsa requested);

}  // namespace kvserve::cpu
