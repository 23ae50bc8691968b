#!/usr/bin/env bash
# `make bench-weights`: model.weight_dtype fp32 / int8 / int4 / int4_asym on the CPU.
#   1. speed: dummy:stories110m-shape (stories110M's body, 85.7M parameters;
#      llama.cpp counts 85.3M for the same weights, its converter tying the
#      head), a 169-token prompt in one step, then 64 greedy decode steps, at
#      1 and 2 threads, every dtype and thread count taking turns within each
#      of RUNS runs (default 5); medians and ratios to fp32 at the same
#      thread count (decode_bench --mode threads);
#   2. quality: stories260K on the dev text, fp32 weights the reference
#      (kvserve eval-kv --weight-dtype int8 --weight-dtype int4 ...);
#   3. load: quantizing dummy:stories110m-shape at load, int8 / int4 /
#      int4_asym on 1 and 2 threads in turns, LOAD_RUNS runs (default 3):
#      median seconds and ns a weight (decode_bench --mode quantize).
# JSON and tables go to the output folder. About 3 minutes on 2 quiet cores.
# bench/README.md runs llama.cpp q8_0 / q4_0 on the same weights.
#
#   bash bench/weight_dtypes.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR defaults to build; OUT_DIR to BUILD_DIR/bench-results/weights.
# KVSERVE_SHARED overrides ../shared.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
[[ "$build" = /* ]] || build="$repo/$build"
out=${2:-$build/bench-results/weights}
mkdir -p "$out"
shared=${KVSERVE_SHARED:-$repo/../shared}
model="$shared/models/stories260k/stories260K.bin"
text="$shared/data/tinystories_valid_dev.txt"
kvserve="$build/kvserve"
decode_bench="$build/bench/decode_bench"
for f in "$kvserve" "$decode_bench" "$model" "$text"; do
  if [[ ! -e "$f" ]]; then
    echo "bench/weight_dtypes.sh: $f is missing (build with 'make build')" >&2
    exit 1
  fi
done

"$decode_bench" dummy:stories110m-shape --mode threads --threads 1,2 --runs "${RUNS:-5}" \
  --weight-dtype fp32,int8,int4,int4_asym --json "$out/speed.json" | tee "$out/speed.txt"
"$kvserve" eval-kv --model "$model" --text "$text" --weight-dtype int8 --weight-dtype int4 \
  --weight-dtype int4_asym --weight-dtype "int8+head int8" --weight-dtype int4/g128 \
  --weight-dtype int4_asym/g128 --json "$out/quality.json" |
  tee "$out/quality.txt"
"$decode_bench" dummy:stories110m-shape --mode quantize --threads 1,2 --runs "${LOAD_RUNS:-3}" \
  --json "$out/load.json" | tee "$out/load.txt"
echo "bench/weight_dtypes.sh: results in $out"
