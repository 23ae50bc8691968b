#include "kernels/cpu/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kvserve::cpu {
namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know
// __builtin_cpu_supports("f16c").
bool HasF16c() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

bool DetectAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
#else
  return false;
#endif
}

bool DetectAvx512Vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return DetectAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

CpuIsa DetectDefault() {
  const bool has_avx2 = CpuHasAvx2();
  const char* env = std::getenv("KVSERVE_CPU_ISA");
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0) {
    return has_avx2 ? CpuIsa::kAvx2 : CpuIsa::kScalar;
  }
  if (std::strcmp(env, "scalar") == 0) return CpuIsa::kScalar;
  if (std::strcmp(env, "avx2") == 0) {
    if (has_avx2) return CpuIsa::kAvx2;
    std::fprintf(stderr, "KVSERVE_CPU_ISA=avx2 but this CPU lacks AVX2/FMA/F16C\n");
    std::abort();
  }
  std::fprintf(stderr, "KVSERVE_CPU_ISA='%s': expected scalar, avx2 or auto\n", env);
  std::abort();
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
  }
  return "?";
}

bool CpuHasAvx2() {
  static const bool has = DetectAvx2();
  return has;
}

bool CpuHasAvx512Vnni() {
  static const bool has = DetectAvx512Vnni();
  return has;
}

CpuIsa DefaultCpuIsa() {
  static const CpuIsa isa = DetectDefault();
  return isa;
}

bool Avx512AllowedFor(const char* env_value) {
  const bool unpinned =
      env_value == nullptr || env_value[0] == '\0' || std::strcmp(env_value, "auto") == 0;
  return unpinned && CpuHasAvx512Vnni();
}

bool Avx512Allowed() {
  static const bool allowed = Avx512AllowedFor(std::getenv("KVSERVE_CPU_ISA"));
  return allowed;
}

CpuIsa ResolveCpuIsa(CpuIsa requested) {
  if (requested == CpuIsa::kAuto) return DefaultCpuIsa();
  if (requested == CpuIsa::kAvx2 && !CpuHasAvx2()) return CpuIsa::kScalar;
  return requested;
}

}  // namespace kvserve::cpu
