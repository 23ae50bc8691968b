#!/usr/bin/env bash
# make test: the GPU bundle packs from this build under its 64 MiB limit, and
# its run.sh says there is no device and exits 77 on a machine without one.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: gpu_bundle_test.sh BUILD_DIR}"
work="$(mktemp -d "$build/gpu-bundle-test.XXXXXX")"
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
