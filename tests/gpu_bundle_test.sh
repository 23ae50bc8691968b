#!/usr/bin/env bash
# make test: the GPU bundle packs from this build under its 64 MiB limit; its
# run.sh gives the bundled libraries to the bundled binaries only (through
# the loader, --check-loader) and finds libcublasLt.so.13 by its soname; and
# it says there is no device and exits 77 on a machine without one.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: gpu_bundle_test.sh BUILD_DIR}"
work="$(cd "$(mktemp -d "$build/gpu-bundle-test.XXXXXX")" && pwd)"
trap 'rm -rf "$work"' EXIT

bash "$root/scripts/gpu-bundle.sh" "$build" "$work/bundle"
size=$(du -sb "$work/bundle" | awk '{print $1}')
echo "bundle: $size bytes"
((size <= 64 * 1024 * 1024)) || { echo "FAIL: bundle is $size bytes, over 64 MiB"; exit 1; }
for f in bin/gpu_tests bin/kvserve run.sh shared/models/stories260k/stories260K.bin \
         shared/models/stories260k/golden_greedy_256.txt lib/GLIBC_VERSION; do
  [[ -e "$work/bundle/$f" ]] || { echo "FAIL: bundle lacks $f"; exit 1; }
done
# No library of the CUDA toolkit or driver rides along.
if ls "$work/bundle/lib" | grep -E '^lib(cuda|cublas|cudart)'; then
  echo "FAIL: CUDA libraries were packed"; exit 1
fi

# Bundled binaries start through their wrappers; nothing leaks to host programs.
set +e
env -u LD_LIBRARY_PATH bash "$work/bundle/run.sh" "$work/out-loader" --check-loader >"$work/loader.log" 2>&1
rc=$?
set -e
cat "$work/loader.log"
[[ $rc == 0 ]] || { echo "FAIL: run.sh --check-loader exited $rc"; exit 1; }
grep -q -- "--library-path" "$work/loader.log" || { echo "FAIL: no loader line"; exit 1; }
if ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  grep -q "/usr/local/cuda/lib64" "$work/loader.log" || { echo "FAIL: cuBLASLt 13 not picked"; exit 1; }
fi
# A machine whose glibc is older than the build's: the bundled loader and
# glibc, still for the bundled binaries alone (GLIBC_VERSION raised here).
echo 99.0 >"$work/bundle/lib/GLIBC_VERSION"
set +e
env -u LD_LIBRARY_PATH bash "$work/bundle/run.sh" "$work/out-loader2" --check-loader >"$work/loader2.log" 2>&1
rc=$?
set -e
cat "$work/loader2.log"
[[ $rc == 0 ]] || { echo "FAIL: run.sh --check-loader (bundled glibc) exited $rc"; exit 1; }
grep -q "ok: $work/bundle/lib/ld-linux-x86-64.so.2 --library-path $work/bundle/lib:" "$work/loader2.log" ||
  { echo "FAIL: the bundled loader was not used"; exit 1; }
if grep -q "LD_LIBRARY_PATH=" "$work/bundle/run.sh"; then
  echo "FAIL: run.sh sets LD_LIBRARY_PATH"; exit 1
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "a device is present: run.sh's no-device exit is not checked here"
  exit 0
fi
set +e
bash "$work/bundle/run.sh" "$work/out" >"$work/run.log" 2>&1
rc=$?
set -e
cat "$work/run.log"
[[ $rc == 77 ]] || { echo "FAIL: run.sh exited $rc without a device, want 77"; exit 1; }
grep -q "no NVIDIA device" "$work/run.log" || { echo "FAIL: run.sh did not say why"; exit 1; }
echo "PASS"
