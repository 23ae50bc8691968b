#!/usr/bin/env bash
# Runs inside a bundle made by scripts/gpu-bundle.sh, on a bare GPU machine:
#   bash gpu-bundle/run.sh OUTDIR
# 1. nvidia-smi, 2. the [gpu] tests, 3. compute-sanitizer memcheck on a small
# case (when the toolkit has it), 4. the daemon with configs/llama3-8b-h200.yaml
# as shipped (serve_check.py), 5. the GPU benchmarks (e2e_bench: the CUDA
# model runner end to end) and the torch peers.
# Logs and one JSON summary (summary.json) go to OUTDIR. Exits 77 when there
# is no device, non-zero when a step failed.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no NVIDIA device here (nvidia-smi finds none): nothing to run" | tee "$out/no-device.txt"
  exit 77
fi

# CUDA toolkit libraries (cuBLASLt) from the machine: the toolkit, else torch's wheels.
cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && cuda_dirs+=("$d")
done
if ! ls /usr/local/cuda/lib64/libcublasLt.so* >/dev/null 2>&1; then
  while read -r f; do cuda_dirs+=("$(dirname "$f")"); done < <(
    find / -xdev -name 'libcublasLt.so*' 2>/dev/null | head -1)
fi
cuda_path="$(IFS=:; echo "${cuda_dirs[*]}")"

# Our libraries first; glibc from the bundle only when the machine's is older.
bundled_libs="$here/lib"
host_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
built_glibc="$(cat "$here/lib/GLIBC_VERSION" 2>/dev/null || echo 0)"
loader=""
if [[ -n "$host_glibc" ]] && [[ "$(printf '%s\n%s\n' "$host_glibc" "$built_glibc" | sort -V | head -1)" != "$built_glibc" ]]; then
  loader="$here/lib/ld-linux-x86-64.so.2"
  echo "run.sh: machine glibc $host_glibc < $built_glibc: running through the bundled loader"
else
  # Keep the machine's own glibc: hide the bundled copies from the search path.
  mkdir -p "$here/lib-noglibc"
  for l in "$here"/lib/*.so*; do
    case "$(basename "$l")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      *) ln -sf "$l" "$here/lib-noglibc/" ;;
    esac
  done
  bundled_libs="$here/lib-noglibc"
fi
export LD_LIBRARY_PATH="$bundled_libs:$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVSERVE_SHARED="$here/shared"
export KVSERVE_BIN="$here/bin/kvserve"
export KVSERVE_TEST_TMP="$out/tmp"
mkdir -p "$KVSERVE_TEST_TMP"

run_bin() {  # run_bin NAME ARGS...: a bundled binary, through the loader when needed
  local b="$here/bin/$1"
  shift
  if [[ -n "$loader" ]]; then
    "$loader" --library-path "$LD_LIBRARY_PATH" "$b" "$@"
  else
    "$b" "$@"
  fi
}
if [[ -n "$loader" ]]; then
  # Binaries the tests start themselves go through the loader too.
  cat >"$here/bin/kvserve-loader" <<EOF
#!/usr/bin/env bash
exec "$loader" --library-path "$LD_LIBRARY_PATH" "$here/bin/kvserve" "\$@"
EOF
  chmod +x "$here/bin/kvserve-loader"
  export KVSERVE_BIN="$here/bin/kvserve-loader"
fi

declare -A status=()
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, logs to OUTDIR/NAME.log
  local name="$1" limit="$2"
  shift 2
  local t0=$(date +%s)
  echo "== $name"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  status[$name]="$rc $(($(date +%s) - t0))"
  tail -25 "$out/$name.log"
  echo "== $name: exit $rc in $(($(date +%s) - t0)) s"
}

nvidia-smi | tee "$out/nvidia-smi.txt"

step gpu_tests 300 run_bin gpu_tests --durations yes
if command -v compute-sanitizer >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  # Small cases only: memcheck is ~100x slower. [sanitize] marks them.
  if [[ -n "$loader" ]]; then
    step memcheck 180 "$cs" --tool memcheck --error-exitcode 1 "$loader" --library-path \
      "$LD_LIBRARY_PATH" "$here/bin/gpu_tests" "[sanitize]"
  else
    step memcheck 180 "$cs" --tool memcheck --error-exitcode 1 "$here/bin/gpu_tests" "[sanitize]"
  fi
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
    gpu_tests | kvserve | kvserve-loader) continue ;;
  esac
  step "$name" 240 run_bin "$name" --json "$out/$name.json"
done
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
echo "run.sh: done in $(($(date +%s) - start)) s; summary in $out/summary.json"

failed=0
for k in "${!status[@]}"; do
  read -r rc _ <<<"${status[$k]}"
  [[ "$rc" == 0 || "$rc" == skipped || "$rc" == 77 ]] || failed=1
done
exit $failed
