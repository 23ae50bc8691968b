#!/usr/bin/env bash
# `make bench-tiers-serve`: the KV tiers served by real daemons. Each
# configuration is `kvserve serve` on a generated YAML config (in the output
# folder), driven by kvserve_bench with two workloads, one after the other:
#   long-document  3 documents of 3,000 tokens, 9 questions of 32 tokens
#                  asked of them in turn (16 output tokens each): the device
#                  pool (192 blocks, 3,072 tokens) holds one document, so
#                  every question after a document's first finds it pushed
#                  out by the others;
#   multi-turn     7 conversations of 3 turns (512 tokens, then +64 a turn,
#                  16 output tokens), in rounds: each turn comes back after
#                  the six other conversations filled the pool.
# Configurations: fp16 pages device-only, +host, +disk, +remote (each tier
# alone, one replica), two replicas with the remote tier behind nginx
# round-robin, and int8 and int4_kc pages device-only and +host. A
# redis-server of its own runs on a free loopback port in a temp folder
# (one database per configuration, so none starts warm).
# The model: dummy:stories110m-shape's first TIER_BENCH_LAYERS layers
# (default 4) at 4,096 positions, written by decode_bench --write-llama2c
# (the 12 layers take 6-18 s a 3,000-token prefill on 2 shared cores, and
# the run 15-25 minutes).
# bench/tier_serve_summary.py prints the table (TTFT p50/p99 of the
# returning requests and their ratio to device-only's recompute, output
# tokens/s, the share of prompt tokens each tier served, whether the greedy
# outputs equal device-only's) and the goals, and writes summary.json.
# About 4-6 minutes on 2 cores.
#
#   bash bench/tier_serve_bench.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR defaults to build; OUT_DIR to BUILD_DIR/bench-results/tiers-serve.
# KVSERVE_SHARED overrides ../shared (the tokenizer and the prompt text).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
[[ "$build" = /* ]] || build="$repo/$build"
out=${2:-$build/bench-results/tiers-serve}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/*.json "$out"/*.prom "$out"/*.log "$out"/*.yaml
shared=${KVSERVE_SHARED:-$repo/../shared}
tokenizer="$shared/models/stories260k/tok512.model"
kvserve="$build/kvserve"
bench="$build/bench/kvserve_bench"
decode_bench="$build/bench/decode_bench"
nginx=/usr/sbin/nginx
for f in "$kvserve" "$bench" "$decode_bench" "$tokenizer" "$shared/data/tinystories_valid_dev.txt" \
  "$nginx" /usr/bin/redis-server /usr/bin/redis-cli; do
  if [[ ! -e "$f" ]]; then
    echo "bench/tier_serve_bench.sh: $f is missing (make build; scripts/install-deps.sh installs" \
      "nginx and redis-server; the tokenizer lives in ../shared)" >&2
    exit 1
  fi
done
layers=${TIER_BENCH_LAYERS:-4}
export KVSERVE_SHARED="$shared"

work=$(mktemp -d)
declare -A pids
cleanup() {
  for name in "${!pids[@]}"; do kill -KILL "${pids[$name]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_http() {  # wait_http PID URL: until URL answers 200 (30 s), or PID exits
  for _ in $(seq 1 300); do
    kill -0 "$1" 2>/dev/null || return 1
    curl -sf "$2" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

started=$(date +%s)
{
  echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu:     $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs for this process"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) at the start"
  echo "commit:  $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "model:   dummy:stories110m-shape, first $layers layers, 4096 positions"
} >"$out/machine.txt"
cat "$out/machine.txt"

model="$work/model.bin"
"$decode_bench" dummy:stories110m-shape --write-llama2c "$model" --max-positions 4096 \
  --num-layers "$layers" >/dev/null

# ---- redis ----------------------------------------------------------------------
mkdir -p "$work/redis"
for attempt in 1 2 3; do
  redis_port=$(free_port)
  /usr/bin/redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save "" \
    --appendonly no --databases 16 >"$out/redis.log" 2>&1 &
  pids[redis]=$!
  for _ in $(seq 1 100); do
    if /usr/bin/redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG; then break 2; fi
    sleep 0.1
  done
  kill -KILL "${pids[redis]}" 2>/dev/null || true
  unset "pids[redis]"
done
[[ -n "${pids[redis]:-}" ]] || { echo "redis-server did not start; its log:" >&2; cat "$out/redis.log" >&2; exit 1; }

# ---- daemons --------------------------------------------------------------------
declare -A http_ports grpc_ports
# start_daemon NAME KV_DTYPE [cache key: value lines...]: `kvserve serve` on
# a generated config (OUT/NAME.yaml) on free ports; waits until /health answers.
start_daemon() {
  local name=$1 dtype=$2
  shift 2
  for attempt in 1 2 3; do
    local hp gp
    hp=$(free_port)
    gp=$(free_port)
    [[ "$hp" != "$gp" ]] || continue
    {
      echo "# bench/tier_serve_bench.sh: configuration $name"
      echo "model:"
      echo "  path: $model"
      echo "  tokenizer: $tokenizer"
      echo "  name: stories110m-shape-${layers}l-4k"
      echo "  device: cpu"
      echo "cache:"
      echo "  kv_dtype: $dtype"
      echo "  block_size: 16"
      echo "  num_blocks: 192"
      echo "  num_swap_blocks: 0"
      echo "  prefix_caching: true"
      for line in "$@"; do echo "  $line"; done
      echo "scheduler:"
      echo "  max_num_seqs: 4"
      echo "  max_num_batched_tokens: 512"
      echo "  max_model_len: 3072"
      echo "server:"
      echo "  host: 127.0.0.1"
      echo "  http_port: $hp"
      echo "  grpc_port: $gp"
      echo "logging:"
      echo "  level: warn"
    } >"$out/$name.yaml"
    "$kvserve" serve --config "$out/$name.yaml" >"$out/daemon-$name.log" 2>&1 &
    local pid=$!
    if wait_http "$pid" "http://127.0.0.1:$hp/health"; then
      pids[$name]=$pid
      http_ports[$name]=$hp
      grpc_ports[$name]=$gp
      return 0
    fi
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q "cannot listen" "$out/daemon-$name.log" || break
  done
  echo "bench/tier_serve_bench.sh: daemon $name did not start; its log:" >&2
  cat "$out/daemon-$name.log" >&2
  exit 1
}

stop() {
  kill -TERM "${pids[$1]}" 2>/dev/null || true
  wait "${pids[$1]}" 2>/dev/null || true
  unset "pids[$1]"
}

# nginx round-robin over the replicas named: deploy/nginx's template as
# render.sh renders it, with least_conn taken out (nginx's default is
# round-robin), the way tests/integration/deploy_lb_test.cc runs it.
start_nginx() {
  local dir="$work/nginx" replicas=() name
  mkdir -p "$dir/temp"
  chmod 755 "$work" "$dir"  # as root, nginx's workers run as nobody
  for name in "$@"; do replicas+=("127.0.0.1:${http_ports[$name]}:${grpc_ports[$name]}"); done
  cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
events { worker_connections 256; }
http {
    client_body_temp_path temp/body;
    proxy_temp_path temp/proxy;
    fastcgi_temp_path temp/fastcgi;
    uwsgi_temp_path temp/uwsgi;
    scgi_temp_path temp/scgi;
    include kvserve.conf;
}
EOF
  for attempt in 1 2 3; do
    nginx_http=$(free_port)
    local ngrpc
    ngrpc=$(free_port)
    [[ "$nginx_http" != "$ngrpc" ]] || continue
    bash "$repo/deploy/nginx/render.sh" --http-listen "127.0.0.1:$nginx_http" \
      --grpc-listen "127.0.0.1:$ngrpc" --access-log "$dir/access.log" --max-body 8MiB \
      "${replicas[@]}" | sed '/^[[:space:]]*least_conn;/d' >"$dir/kvserve.conf"
    "$nginx" -e stderr -p "$dir/" -c nginx.conf \
      -g "daemon off; pid $dir/nginx.pid; error_log stderr notice;" >"$out/nginx.log" 2>&1 &
    pids[nginx]=$!
    if wait_http "${pids[nginx]}" "http://127.0.0.1:$nginx_http/health"; then return 0; fi
    kill -KILL "${pids[nginx]}" 2>/dev/null || true
    wait "${pids[nginx]}" 2>/dev/null || true
    unset "pids[nginx]"
    grep -q "Address already in use" "$out/nginx.log" || break
  done
  echo "bench/tier_serve_bench.sh: nginx did not start; its log:" >&2
  cat "$out/nginx.log" >&2
  exit 1
}

# snapshot CONFIG WORKLOAD WHEN REPLICA...: each replica's /metrics.
snapshot() {
  local config=$1 workload=$2 when=$3 r
  shift 3
  for r in "$@"; do
    curl -sf "http://127.0.0.1:${http_ports[$r]}/metrics" >"$out/$config.$workload.$when.$r.prom"
  done
}

# run_workload CONFIG WORKLOAD URL "REPLICA..." [kvserve_bench flags...]:
# one workload through URL, the replicas' metrics around it.
run_workload() {
  local config=$1 workload=$2 url=$3 replicas
  read -r -a replicas <<<"$4"
  shift 4
  echo "-- $config: $workload"
  snapshot "$config" "$workload" before "${replicas[@]}"
  "$bench" --url "$url" --tokenizer "$tokenizer" --token-ids true --metrics-url none \
    --concurrency 1 --output-len 16 --progress never --label "$config" \
    --workload "${workload//_/-}" "$@" --json "$out/$config.$workload.json" \
    --requests-json "$out/$config.$workload.requests.json"
  snapshot "$config" "$workload" after "${replicas[@]}"
}

# run_workloads CONFIG URL REPLICA...: both workloads through URL.
run_workloads() {
  local config=$1 url=$2
  shift 2
  run_workload "$config" long_document "$url" "$*" --groups 3 --prefix-len 3000 \
    --suffix-len 32 --num-prompts 9 --seed 1
  run_workload "$config" multi_turn "$url" "$*" --groups 7 --prefix-len 512 \
    --suffix-len 64 --num-prompts 21 --seed 2
}

# single CONFIG KV_DTYPE [cache lines...]: one replica, both workloads.
single() {
  local config=$1
  start_daemon "$@"
  run_workloads "$config" "http://127.0.0.1:${http_ports[$config]}" "$config"
  stop "$config"
}

redis_url="redis://127.0.0.1:$redis_port"
single fp16-device fp16
single fp16-host fp16 "host_tier_bytes: 512MiB"
single fp16-disk fp16 "disk_tier_path: $work/disk-fp16.kv" "disk_tier_bytes: 512MiB"
single fp16-remote fp16 "remote_tier_url: $redis_url/1"
# Two replicas sharing Redis database 2, behind nginx round-robin.
start_daemon fp16-2rep-a fp16 "remote_tier_url: $redis_url/2"
start_daemon fp16-2rep-b fp16 "remote_tier_url: $redis_url/2"
start_nginx fp16-2rep-a fp16-2rep-b
run_workloads fp16-2rep-remote "http://127.0.0.1:$nginx_http" fp16-2rep-a fp16-2rep-b
stop nginx
stop fp16-2rep-a
stop fp16-2rep-b
for dtype in int8 int4_kc; do
  single "$dtype-device" "$dtype"
  single "$dtype-host" "$dtype" "host_tier_bytes: 512MiB"
done
echo "took $(($(date +%s) - started)) s" >>"$out/machine.txt"

/usr/bin/python3 "$repo/bench/tier_serve_summary.py" "$out" | tee "$out/summary.txt"
echo "results: $out"
