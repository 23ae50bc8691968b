#!/usr/bin/env bash
# Runs inside a bundle made by scripts/gpu-bundle.sh, on a bare GPU machine:
#   bash gpu-bundle/run.sh OUTDIR
#   bash gpu-bundle/run.sh OUTDIR --check-loader   (no device needed: sets up
#        the wrappers, checks that the bundled binaries start through them
#        and that nothing was exported to host programs, then exits)
#   bash gpu-bundle/run.sh OUTDIR [--only "STEP ..."] [--budget SECONDS]
#        --only runs the named steps alone (gpu_tests, memcheck, serve_h200,
#        a benchmark's binary name, e2e_bench_fp8, a torch peer's name);
#        --budget caps the whole run: each step's limit is cut to what is
#        left, and a step with under 20 s left is skipped. A device lease is
#        short, so a first call runs what matters first within it.
# 1. nvidia-smi, 2. the [gpu] tests, 3. compute-sanitizer memcheck on a small
# case (when the toolkit has it), 4. the daemon with configs/llama3-8b-h200.yaml
# as shipped (serve_check.py), 5. the GPU benchmarks (e2e_bench: the CUDA
# model runner end to end) and the torch peers.
# One JSON summary (summary.json) and the logs (logs.tgz) go to OUTDIR.
# Exits 77 when there is no device, non-zero when a step failed.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh OUTDIR [--check-loader] [--only STEPS] [--budget SECONDS]}"
shift
check_loader=0
only=""
budget=100000
while (($#)); do
  case "$1" in
    --check-loader) check_loader=1 ;;
    --only) only=" ${2:?--only needs a list of steps} " && shift ;;
    --budget) budget="${2:?--budget needs seconds}" && shift ;;
    *) echo "run.sh: unknown argument $1" >&2 && exit 2 ;;
  esac
  shift
done
ld_path_before="${LD_LIBRARY_PATH-<unset>}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)

if ((!check_loader)) && { ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; }; then
  echo "run.sh: no NVIDIA device here (nvidia-smi finds none): nothing to run" | tee "$out/no-device.txt"
  exit 77
fi

# The bundle's libraries (lib/: its glibc, libstdc++, ...) go to the
# bundled binaries only, through a dynamic loader run by hand with
# --library-path: nothing is exported, so every host program this script
# or the tests start (nvidia-smi, python3, compute-sanitizer, coreutils)
# keeps the machine's own libraries, whatever glibc the bundle carries.

# cuBLASLt 13 (the soname the binaries were linked against) from the
# machine: the toolkit, else the first directory anywhere that holds
# exactly libcublasLt.so.13 (torch's wheels may ship .so.12 beside it).
cublaslt_soname="libcublasLt.so.13"
cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e "$d/$cublaslt_soname" ]] && cuda_dirs+=("$d")
done
if ((${#cuda_dirs[@]} == 0)); then
  while read -r f; do cuda_dirs+=("$(dirname "$f")"); done < <(
    find / -xdev -name "$cublaslt_soname" 2>/dev/null | head -1)
fi
if ((${#cuda_dirs[@]} == 0)); then
  echo "run.sh: $cublaslt_soname not found here (the CUDA 13 toolkit or its cuBLAS wheel)"
fi
# The driver's libcuda.so.1 and the rest of the system, last.
for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && cuda_dirs+=("$d")
done
cuda_path="$(IFS=:; echo "${cuda_dirs[*]}")"

# The bundled glibc (and its loader) only when the machine's is older than
# the one the binaries were built against; else the machine's loader with
# the bundled libraries minus glibc.
host_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
built_glibc="$(cat "$here/lib/GLIBC_VERSION" 2>/dev/null || echo 0)"
if [[ -n "$host_glibc" ]] && [[ "$(printf '%s\n%s\n' "$host_glibc" "$built_glibc" | sort -V | head -1)" != "$built_glibc" ]]; then
  loader="$here/lib/ld-linux-x86-64.so.2"
  bundled_libs="$here/lib"
  echo "run.sh: machine glibc $host_glibc < $built_glibc: the bundled binaries run on the bundled glibc"
else
  loader=/lib64/ld-linux-x86-64.so.2
  [[ -x "$loader" ]] || loader=/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
  mkdir -p "$here/lib-noglibc"
  for l in "$here"/lib/*.so*; do
    case "$(basename "$l")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      *) ln -sf "$l" "$here/lib-noglibc/" ;;
    esac
  done
  bundled_libs="$here/lib-noglibc"
fi
bin_path="$bundled_libs:$cuda_path"
export KVSERVE_SHARED="$here/shared"
export KVSERVE_TEST_TMP="$out/tmp"
mkdir -p "$KVSERVE_TEST_TMP"

# Every bundled binary is called through a wrapper in bin-run/ (the tests
# start kvserve through KVSERVE_BIN, serve_check.py too): the loader with
# the bundle's library path, for that process alone.
mkdir -p "$here/bin-run"
for b in "$here"/bin/*; do
  printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$loader" "$bin_path" "$b" \
    >"$here/bin-run/$(basename "$b")"
  chmod +x "$here/bin-run/$(basename "$b")"
done
export KVSERVE_BIN="$here/bin-run/kvserve"
# (Steps name the wrappers' paths: timeout(1) runs programs, not shell
# functions.)

if ((check_loader)); then
  fail() { echo "run.sh --check-loader: FAIL: $*"; exit 1; }
  [[ "${LD_LIBRARY_PATH-<unset>}" == "$ld_path_before" ]] || fail "LD_LIBRARY_PATH changed"
  # A host program sees the machine's environment, not the bundle's.
  env | grep -q "$here/lib" && fail "a host program's environment names the bundle's lib/"
  for b in "$here"/bin/*; do
    grep -q -- "--library-path" "$here/bin-run/$(basename "$b")" || fail "no wrapper for $b"
  done
  "$here/bin-run/kvserve" --help >/dev/null 2>&1 || fail "bin-run/kvserve --help exited $?"
  "$here/bin-run/gpu_tests" --list-tests >/dev/null 2>&1
  rc=$?
  [[ $rc == 0 || $rc == 77 ]] || fail "bin-run/gpu_tests exited $rc (the loader or a library)"
  echo "run.sh --check-loader: ok: $loader --library-path $bin_path"
  exit 0
fi

declare -A status=()
wanted() {  # wanted NAME: whether --only (when given) names the step
  [[ -z "$only" || "$only" == *" $1 "* ]]
}
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, logs to OUTDIR/NAME.log
  local name="$1" limit="$2"
  shift 2
  wanted "$name" || return 0
  local left=$((budget - ($(date +%s) - start)))
  if ((left < 20)); then
    echo "== $name: skipped, ${left} s of the budget left"
    status[$name]="skipped 0"
    return 0
  fi
  ((limit > left)) && limit=$left
  local t0=$(date +%s)
  echo "== $name (limit $limit s)"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  status[$name]="$rc $(($(date +%s) - t0))"
  tail -25 "$out/$name.log"
  echo "== $name: exit $rc in $(($(date +%s) - t0)) s"
  return $rc
}

nvidia-smi | tee "$out/nvidia-smi.txt"

if ! step gpu_tests 300 "$here/bin-run/gpu_tests" --durations yes && [[ "${status[gpu_tests]}" != skipped* ]]; then
  # A crash or a sticky CUDA error takes every later case with it: each
  # case again in a process of its own, so the log names every failure.
  "$here/bin-run/gpu_tests" --list-test-names-only 2>/dev/null | sed -e '/^$/d' -e '/^[0-9]* test case/d' \
    >"$out/gpu_test_names.txt"
  : >"$out/gpu_tests_each.log"
  while IFS= read -r name; do
    left=$((budget - ($(date +%s) - start)))
    ((left < 30)) && echo "SKIP (budget) $name" >>"$out/gpu_tests_each.log" && continue
    t0=$(date +%s)
    # A name is a test spec: escape its tag brackets and commas.
    spec="$(printf '%s' "$name" | sed -e 's/\\/\\\\/g' -e 's/\[/\\[/g' -e 's/,/\\,/g')"
    timeout 60 "$here/bin-run/gpu_tests" "$spec" >"$out/one.log" 2>&1
    rc=$?
    echo "rc=$rc $(($(date +%s) - t0))s $name" >>"$out/gpu_tests_each.log"
    ((rc != 0)) && sed -n '/^-----/,$p' "$out/one.log" | head -80 | sed 's/^/    /' >>"$out/gpu_tests_each.log"
  done <"$out/gpu_test_names.txt"
  rm -f "$out/one.log"
  echo "== gpu_tests, one process per case:"
  grep -c '^rc=0 ' "$out/gpu_tests_each.log" | sed 's/$/ cases passed/'
  grep -v '^rc=0 ' "$out/gpu_tests_each.log" | head -60
fi
if command -v compute-sanitizer >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  # Small cases only: memcheck is ~100x slower. [sanitize] marks them.
  # compute-sanitizer is the machine's; it starts the wrapper (the loader).
  step memcheck 180 "$cs" --tool memcheck --error-exitcode 1 "$here/bin-run/gpu_tests" "[sanitize]"
else
  echo "run.sh: compute-sanitizer not found: memcheck skipped" | tee "$out/memcheck.log"
  status[memcheck]="skipped 0"
fi
# The shipped H200 config, as is: ready, one completion, a clean drain.
if command -v python3 >/dev/null 2>&1; then
  step serve_h200 240 python3 "$here/serve_check.py" --config "$here/configs/llama3-8b-h200.yaml" \
    --json "$out/serve_h200.json"
fi
for b in "$here"/bin/*; do
  name="$(basename "$b")"
  case "$name" in
    gpu_tests | kvserve) continue ;;
  esac
  step "$name" 240 "$here/bin-run/$name" --json "$out/$name.json"
done
# fp8_e4m3 weights against e2e_bench's bf16 rows above (docs/fp8-weights.md).
if [[ -x "$here/bin/e2e_bench" ]]; then
  step e2e_bench_fp8 240 "$here/bin-run/e2e_bench" --weight-dtype fp8_e4m3 --kv bf16 --batches 1,32,128 \
    --contexts 1024 --no-capacity --json "$out/e2e_bench_fp8.json"
fi
if command -v python3 >/dev/null 2>&1 && python3 -c 'import torch' 2>/dev/null; then
  for py in "$here"/python/*.py; do
    [[ -f "$py" ]] || continue
    name="$(basename "$py" .py)"
    step "$name" 180 python3 "$py" --json "$out/$name.json"
  done
fi

# One summary: each step's exit code and seconds, and the benchmarks' JSON.
{
  echo "{"
  echo "  \"seconds\": $(($(date +%s) - start)),"
  echo "  \"steps\": {"
  first=1
  for k in "${!status[@]}"; do
    read -r rc secs <<<"${status[$k]}"
    [[ $first == 1 ]] || echo ","
    first=0
    printf '    "%s": {"exit": "%s", "seconds": %s}' "$k" "$rc" "$secs"
  done
  echo ""
  echo "  },"
  echo "  \"results\": {"
  first=1
  for j in "$out"/*.json; do
    [[ "$(basename "$j")" == summary.json ]] && continue
    [[ $first == 1 ]] || echo ","
    first=0
    printf '    "%s": ' "$(basename "$j" .json)"
    cat "$j"
  done
  echo ""
  echo "  }"
  echo "}"
} >"$out/summary.json"
# A device lease may hand back only a few files of OUTDIR: the logs and
# the benchmarks' JSON go into one archive beside summary.json (which holds
# the JSON too); the test scratch folder is dropped.
rm -rf "$KVSERVE_TEST_TMP"
(cd "$out" && find . -maxdepth 1 -type f ! -name summary.json ! -name logs.tgz ! -name .packed -printf '%f\n' |
  sort >.packed && tar czf logs.tgz -T .packed && xargs rm -f <.packed && rm -f .packed)
echo "run.sh: done in $(($(date +%s) - start)) s; summary in $out/summary.json, logs in $out/logs.tgz"

failed=0
for k in "${!status[@]}"; do
  read -r rc _ <<<"${status[$k]}"
  [[ "$rc" == 0 || "$rc" == skipped || "$rc" == 77 ]] || failed=1
done
exit $failed
