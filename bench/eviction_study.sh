#!/usr/bin/env bash
# `make bench-eviction`: the full KV eviction study on stories260K, as the
# docs/kv-eviction.md reports it:
#   1. long text: one 4,000-token stream of the dev stories (one BOS), every
#      policy with fp32 and int8 pages at a 256-token budget, dense attention
#      and the recompute baseline; perplexity per 256-token window;
#   2. the budget sweep: 16 streams of the model's 512 positions, every
#      evicting policy at 10/20/30/50/70% budgets against dense attention.
# The learned policy's predictor is trained first (kvserve train-evictor) on
# streams past the ones the study reads. JSON, tables and PNG plots go to the
# output folder. Takes about 3-5 minutes on 2 cores.
#
#   bash bench/eviction_study.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR defaults to build; OUT_DIR to BUILD_DIR/bench-results/eviction.
# KVSERVE_SHARED overrides ../shared.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
[[ "$build" = /* ]] || build="$repo/$build"
out=${2:-$build/bench-results/eviction}
mkdir -p "$out"
shared=${KVSERVE_SHARED:-$repo/../shared}
model="$shared/models/stories260k/stories260K.bin"
text="$shared/data/tinystories_valid_dev.txt"
kvserve="$build/kvserve"
for f in "$kvserve" "$model" "$text"; do
  if [[ ! -e "$f" ]]; then
    echo "bench/eviction_study.sh: $f is missing (build with 'make build')" >&2
    exit 1
  fi
done

# Past the 16 x 511 tokens of the sweep's streams.
"$kvserve" train-evictor --model "$model" --text "$text" --streams 8 --skip-tokens 8176 \
  --out "$out/evictor.txt" | tee "$out/train-evictor.txt"
"$kvserve" eval-kv --model "$model" --text "$text" --policy all --budget 256 \
  --stream-tokens 4000 --kv-dtype fp32 --kv-dtype int8 --evictor-model "$out/evictor.txt" \
  --json "$out/long_text.json" --png "$out/long_text.png" | tee "$out/long_text.txt"
"$kvserve" eval-kv --model "$model" --text "$text" \
  --policy sliding_window,streaming,h2o,scissorhands,learned --sweep 16 \
  --evictor-model "$out/evictor.txt" --json "$out/sweep.json" --png "$out/sweep.png" |
  tee "$out/sweep.txt"
echo "results in $out"
