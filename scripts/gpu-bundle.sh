#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run kvserve's [gpu] tests and GPU
# benchmarks into one folder (default gpu-bundle/, ignored by git):
#   bin/     gpu_tests, the GPU benchmarks, kvserve (stripped copies)
#   lib/     the shared libraries they load that such a machine lacks: what
#            ldd lists, minus libcuda and the CUDA toolkit's own libraries
#            (cuBLAS, cudart, ...), which the machine has. glibc and its
#            loader are packed too, and run.sh uses them only when the
#            machine's glibc is older than the one the binaries were built
#            against.
#   shared/  the stories260K reference model (from ../shared), for
#            KVSERVE_SHARED
#   python/  the torch peer benchmarks
#   configs/ the shipped configs; serve_check.py starts kvserve with one
#   run.sh   `bash gpu-bundle/run.sh OUTDIR` on the GPU machine
# The bundle must stay under 64 MiB (checked here and by make test).
#
# Usage: scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/gpu-bundle}"
limit_bytes=$((64 * 1024 * 1024))
shared="${KVSERVE_SHARED:-$root/../shared}"

if [[ ! -x "$build/tests/gpu_tests" ]]; then
  echo "gpu-bundle: $build/tests/gpu_tests not found: build with CUDA first (make build)" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/shared/models/stories260k" "$out/python"

bins=("$build/tests/gpu_tests" "$build/kvserve")
for b in "$build"/bench/gpu_* "$build"/bench/attention_bench "$build"/bench/e2e_bench; do
  [[ -x "$b" ]] && bins+=("$b")
done
for b in "${bins[@]}"; do
  cp "$b" "$out/bin/"
  strip --strip-unneeded "$out/bin/$(basename "$b")"
done

# Libraries: everything ldd resolves, except the driver and the CUDA
# toolkit's libraries (present on the GPU machine, and far too big).
is_cuda_lib() {
  case "$(basename "$1")" in
    libcuda.so* | libcudart.so* | libcublas*.so* | libcublasLt.so* | libnvidia-* | libnvrtc* | \
      libnccl.so* | libcurand.so* | libcusparse* | libcufft* | libnvJitLink*) return 0 ;;
  esac
  return 1
}
declare -A seen=()
for b in "${bins[@]}"; do
  while read -r lib; do
    [[ -z "$lib" || -n "${seen[$lib]:-}" ]] && continue
    seen[$lib]=1
    is_cuda_lib "$lib" && continue
    cp -L "$lib" "$out/lib/"
  done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
for l in "$out"/lib/*.so*; do
  strip --strip-unneeded "$l" 2>/dev/null || true
done
# The glibc the binaries were linked against, for run.sh's version check.
# (awk reads all of ldd's output: `| head -1` could kill ldd with SIGPIPE,
# which pipefail + set -e turn into a silent failure under load.)
ldd --version 2>&1 | awk 'NR == 1 {print $NF}' >"$out/lib/GLIBC_VERSION"

for f in stories260K.bin tok512.model tok512.bin golden_greedy_256.txt; do
  cp "$shared/models/stories260k/$f" "$out/shared/models/stories260k/"
done
if [[ -d "$shared/data" ]]; then
  mkdir -p "$out/shared/data"
  cp "$shared"/data/*.txt "$out/shared/data/" 2>/dev/null || true
fi
for py in "$root"/bench/gpu/*.py; do
  [[ -f "$py" ]] && cp "$py" "$out/python/"
done
cp "$root/scripts/gpu-run.sh" "$out/run.sh"
cp "$root/scripts/gpu-serve-check.py" "$out/serve_check.py"
cp -r "$root/configs" "$out/configs"

size=$(du -sb "$out" | awk '{print $1}')
echo "gpu-bundle: $out: ${#bins[@]} binaries, $(ls "$out/lib" | wc -l) files in lib/, $((size / 1024)) KiB"
if ((size > limit_bytes)); then
  echo "gpu-bundle: $size bytes is over the 64 MiB limit" >&2
  du -ab "$out" | sort -n | tail -10 >&2
  exit 1
fi
