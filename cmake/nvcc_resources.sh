#!/usr/bin/env bash
# The CUDA compiler launcher of kvserve_cuda (CMakeLists.txt): runs the
# compile (through the next launcher, e.g. ccache, when one is given) with
# nvcc's --resource-usage and writes ptxas's report of every kernel
# (registers, stack, spills, shared memory) to OBJECT.resources beside the
# object, keeping it out of the build's output; any other output passes
# through. tests/cuda_stub/resource_check.sh reads those files, so the
# kernels are compiled once, by the build.
#
#   nvcc_resources.sh [LAUNCHER...] NVCC ARGS... -o OBJECT ...
set -uo pipefail
obj=""
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  [[ "${args[i]}" == "-o" ]] && obj="${args[i + 1]}"
done
log=$(mktemp)
"$@" --resource-usage >"$log" 2>&1
rc=$?
report='^ptxas info|bytes stack frame'
if [[ -n "$obj" && $rc -eq 0 ]]; then
  grep -E "$report" "$log" >"$obj.resources.tmp" || true
  mv "$obj.resources.tmp" "$obj.resources"
fi
grep -vE "$report" "$log" >&2 || true
rm -f "$log"
exit $rc
