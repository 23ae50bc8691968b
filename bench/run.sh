#!/usr/bin/env bash
# `make bench`: the CPU serving suite on stories260K. Starts its own daemons
# on free loopback ports (and stops them, whatever happens), drives them with
# kvserve_bench, and prints one table:
#   1. kept-alive against fresh-connection latency of a 1-token completion
#      (HTTP plain, HTTP streamed, gRPC; p50 over 200 requests each);
#   2. one client's back-to-back 128-token requests through the daemon
#      against `kvserve generate`'s decode rate (same prompt length, greedy);
#   3. a shared-prefix workload with prefix caching on and off;
#   4. int8, k8v4 and int4 KV against fp32 KV with a pool of the same byte
#      size: sequences running at once, preemptions, throughput.
# JSON results, daemon logs, the summary and the plots go to the output
# folder. Takes about 2-3 minutes on 2 cores.
#
#   bash bench/run.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR defaults to build; OUT_DIR to BUILD_DIR/bench-results/<UTC time>
# (BUILD_DIR/bench-results/latest points at the newest). KVSERVE_SHARED
# overrides ../shared (the model and the prompt text).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
[[ "$build" = /* ]] || build="$repo/$build"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${2:-$build/bench-results/$stamp}
mkdir -p "$out"
if [[ -z "${2:-}" ]]; then ln -sfn "$stamp" "$build/bench-results/latest"; fi

shared=${KVSERVE_SHARED:-$repo/../shared}
model_dir="$shared/models/stories260k"
kvserve="$build/kvserve"
bench="$build/bench/kvserve_bench"
for f in "$kvserve" "$bench" "$model_dir/stories260K.bin" "$model_dir/tok512.model" \
  "$shared/data/tinystories_valid_dev.txt"; do
  if [[ ! -e "$f" ]]; then
    echo "bench/run.sh: $f is missing (build with 'make build'; the model lives in ../shared)" >&2
    exit 1
  fi
done
tokenizer="$model_dir/tok512.model"
export KVSERVE_SHARED="$shared"

# ---- daemons ------------------------------------------------------------------
declare -A pids http_ports grpc_ports
cleanup() {
  for name in "${!pids[@]}"; do
    kill -KILL "${pids[$name]}" 2>/dev/null || true
  done
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_daemon NAME [key=value ...]: `kvserve serve` with the default config
# and these overrides, on free ports; waits until /health answers.
start_daemon() {
  local name=$1
  shift
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  for attempt in 1 2 3; do
    local hp gp
    hp=$(free_port)
    gp=$(free_port)
    [[ "$hp" != "$gp" ]] || continue
    KVSERVE_MODEL_DIR="$model_dir" "$kvserve" serve --config "$repo/configs/default.yaml" \
      --set server.http_port="$hp" --set server.grpc_port="$gp" --set logging.level=warn \
      "${sets[@]}" >"$out/daemon-$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 300); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if curl -sf "http://127.0.0.1:$hp/health" >/dev/null 2>&1; then
        pids[$name]=$pid
        http_ports[$name]=$hp
        grpc_ports[$name]=$gp
        return 0
      fi
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q "cannot listen" "$out/daemon-$name.log" || break
  done
  echo "bench/run.sh: daemon $name did not start; its log:" >&2
  cat "$out/daemon-$name.log" >&2
  exit 1
}

stop_daemon() {
  local name=$1
  kill -TERM "${pids[$name]}" 2>/dev/null || true
  wait "${pids[$name]}" 2>/dev/null || true
  unset "pids[$name]"
}

# run_bench NAME JSON [kvserve_bench flags...] against daemon NAME.
run_bench() {
  local name=$1 json=$2
  shift 2
  echo "== $json: $*" >>"$out/tables.txt"
  "$bench" --url "http://127.0.0.1:${http_ports[$name]}" --grpc-target "127.0.0.1:${grpc_ports[$name]}" \
    --tokenizer "$tokenizer" --json "$out/$json" "$@" | tee -a "$out/tables.txt"
}

started=$(date +%s)
{
  echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu:     $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs for this process"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) at the start"
  echo "commit:  $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$out/machine.txt"
cat "$out/machine.txt"

# ---- 1 + 2: the default daemon ------------------------------------------------
start_daemon fp32
echo "-- connection latency (200 requests each, interleaved)"
run_bench fp32 probe.json --probe 200
echo "-- one client, back-to-back 128-token requests"
run_bench fp32 single_client.json --label "daemon, 1 client" --workload fixed \
  --input-len 5 --output-len 128 --concurrency 1 --num-prompts 200
# `kvserve generate` with a prompt of the same length (BOS + 4 tokens); each
# run lasts milliseconds, so take the median of many.
: >"$out/generate.txt"
for _ in $(seq 1 15); do
  "$kvserve" generate --model "$model_dir/stories260K.bin" --tokenizer "$tokenizer" \
    --prompt "Once upon a time" --max-tokens 128 --temperature 0 2>>"$out/generate.txt" >/dev/null
done

# merge_runs OUT.json IN.json...: one file with the runs of all inputs, in order.
merge_runs() {
  local dest=$1
  shift
  python3 - "$dest" "$@" <<'EOF'
import json, sys
docs = [json.load(open(p)) for p in sys.argv[2:]]
merged = docs[0]
merged["runs"] = [r for d in docs for r in d["runs"]]
json.dump(merged, open(sys.argv[1], "w"), indent=2)
EOF
  rm -f "$@"
}

# The configurations of one comparison run side by side: their daemons are
# all up, and each load level runs on every configuration before the next
# level, so a machine that gets busier or quieter affects them alike.

# ---- 3: prefix caching on / off -----------------------------------------------
start_daemon nocache cache.prefix_caching=false
prefix_flags=(--workload shared-prefix --groups 4 --prefix-len 384 --suffix-len 16 --output-len 16
  --token-ids true --seed 1 --duration 3)
on_parts=() off_parts=()
for c in 1 4 16; do
  echo "-- shared prefix, $c clients: prefix caching on, then off"
  run_bench fp32 "prefix_on_c$c.json" --label "prefix caching on" "${prefix_flags[@]}" --concurrency "$c"
  run_bench nocache "prefix_off_c$c.json" --label "prefix caching off" "${prefix_flags[@]}" \
    --concurrency "$c"
  on_parts+=("$out/prefix_on_c$c.json")
  off_parts+=("$out/prefix_off_c$c.json")
done
merge_runs "$out/prefix_on.json" "${on_parts[@]}"
merge_runs "$out/prefix_off.json" "${off_parts[@]}"
stop_daemon fp32
stop_daemon nocache

# ---- 4: KV formats with the same pool bytes ----------------------------------
# 128 + 128 tokens per request is 16 blocks of 16 tokens. 4 MiB holds 204
# fp32 blocks (12 such sequences) and 546 int8 blocks (34): at 16 and 32
# clients fp32 must preempt and the quantized formats need not.
pool=4MiB
kv_configs=(fp32:16 int8:16 k8v4:16 int4:16 fp32:32)
kv_flags=(--workload fixed --input-len 128 --output-len 128 --duration 4 --seed 2)
declare -A kv_parts
for cfg in "${kv_configs[@]}"; do
  dtype=${cfg%%:*}
  bs=${cfg##*:}
  start_daemon "kv-$dtype-b$bs" cache.kv_dtype="$dtype" cache.block_size="$bs" \
    cache.memory_bytes="$pool" cache.num_blocks=0 cache.num_swap_blocks=0 cache.prefix_caching=false
done
for c in 1 4 16 32; do
  echo "-- KV formats, pool $pool, $c clients"
  for cfg in "${kv_configs[@]}"; do
    dtype=${cfg%%:*}
    bs=${cfg##*:}
    name="kv-$dtype-b$bs"
    label="$dtype"
    [[ "$bs" == 16 ]] || label="$dtype, block $bs"
    run_bench "$name" "${name}_c$c.json" --label "$label" "${kv_flags[@]}" --concurrency "$c"
    kv_parts[$name]="${kv_parts[$name]:-} $out/${name}_c$c.json"
  done
done
for cfg in "${kv_configs[@]}"; do
  dtype=${cfg%%:*}
  bs=${cfg##*:}
  name="kv-$dtype-b$bs"
  read -r -a parts <<<"${kv_parts[$name]}"
  merge_runs "$out/$name.json" "${parts[@]}"
  stop_daemon "$name"
done

echo "suite took $(($(date +%s) - started)) s" >>"$out/machine.txt"

# ---- summary and plots --------------------------------------------------------
python3 "$repo/bench/summarize.py" "$out" | tee "$out/summary.md"
if command -v gnuplot >/dev/null 2>&1; then
  bash "$repo/bench/plot.sh" "$out/kv_formats.png" \
    "$out"/kv-fp32-b16.json "$out"/kv-int8-b16.json "$out"/kv-k8v4-b16.json \
    "$out"/kv-int4-b16.json "$out"/kv-fp32-b32.json
  bash "$repo/bench/plot.sh" "$out/prefix_caching.png" "$out"/prefix_on.json "$out"/prefix_off.json
  echo "plots: $out/kv_formats.png $out/prefix_caching.png"
else
  echo "(gnuplot is not installed: no plots; scripts/install-deps.sh installs gnuplot-nox)"
fi
echo "results: $out"
