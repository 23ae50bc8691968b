#!/usr/bin/env bash
# Runs a built kvserve CPU image the way a deployment does and checks it:
#   - no compiler, node, nginx, prometheus or -dev package in the image;
#   - read-only root filesystem, as the image's non-root user (10001), the
#     reference model mounted read-only at /models, /tmp a tmpfs;
#   - GET /health becomes 200, a temperature-0 completion equals
#     golden_greedy_256.txt byte for byte, the gRPC health check answers
#     SERVING, the image's HEALTHCHECK command passes;
#   - SIGTERM with long streams in flight: /health turns 503, new
#     completions get 503, every stream still ends with [DONE], the
#     container exits 0 ("drained").
# Not part of `make test` (building the image takes long); run after
# `make image`:
#   deploy/test-image.sh [IMAGE]            (default kvserve:cpu)
# Uses docker where an engine answers, else podman from Debian (installed
# when missing) with the same storage as deploy/build-image.sh. Needs curl
# and python3 with python3-grpcio on the host.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${1:-kvserve:cpu}
name=kvserve-image-test-$$
model=$(bash "$repo/scripts/fetch-model.sh" stories260k)
golden=$model/golden_greedy_256.txt
[[ -f "$golden" ]] || golden=$repo/../shared/models/stories260k/golden_greedy_256.txt

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  engine=(docker)
  run_flags=()
else
  if ! command -v podman >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman >/dev/null
  fi
  # vfs: the storage buildah built into; cgroupfs and file events: no
  # systemd in a sandbox; runc as in the image build notes.
  engine=(podman --storage-driver "${STORAGE_DRIVER:-vfs}" --cgroup-manager cgroupfs
          --events-backend file --runtime runc)
  # A container starts without CAP_SYS_RESOURCE, so runc cannot raise a
  # limit above what podman itself runs with; podman's defaults (nofile
  # 1048576, nproc 4194304) fail inside a sandbox with lower hard limits
  # ("error setting rlimit type 7: operation not permitted").
  read -r -a run_flags <<<"${KVSERVE_IMAGE_ULIMITS:---ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=32768:32768}"
  # podman runs HEALTHCHECK from systemd timers; without systemd it logs
  # "unable to get systemd connection to add healthchecks" and goes on
  # (harmless): `podman healthcheck run` below runs the check once.
fi

# A python3 with Debian's python3-grpcio (a pyenv or venv one on PATH may
# lack it).
python=""
for p in "${KVSERVE_PYTHON:-}" python3 /usr/bin/python3; do
  if [[ -n "$p" ]] && "$p" -c 'import grpc' 2>/dev/null; then python=$p; break; fi
done
[[ -n "$python" ]] || fail "no python3 with grpc (Debian: python3-grpcio)"

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port=$(free_port)
grpc_port=$(free_port)
while [[ "$grpc_port" == "$http_port" ]]; do grpc_port=$(free_port); done
base=http://127.0.0.1:$http_port

cleanup() { "${engine[@]}" rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "image $image"
"${engine[@]}" image inspect --format '{{.Id}} {{.Size}} bytes' "$image"
"${engine[@]}" image inspect --format 'user={{.Config.User}} entrypoint={{.Config.Entrypoint}} healthcheck={{.Config.Healthcheck}}' "$image" ||
  "${engine[@]}" image inspect --format 'user={{.User}} healthcheck={{.HealthCheck}}' "$image"

step "runtime packages: nothing to build or to run beside kvserve"
"${engine[@]}" run --rm --no-healthcheck ${run_flags[@]+"${run_flags[@]}"} --network host --entrypoint dpkg-query "$image" \
  -W -f '${Package}\n' >/tmp/$name.packages
echo "$(wc -l </tmp/$name.packages) packages"
if grep -E '^(gcc|g\+\+|cpp|clang|cmake|make|nodejs|npm|nginx|prometheus|python3)(-[0-9.]+)?$|-dev$' /tmp/$name.packages; then
  fail "the runtime image holds build or test tools (above)"
fi
rm -f /tmp/$name.packages

step "run: read-only, user 10001, model read-only at /models, ports $http_port/$grpc_port"
# Host networking: no bridge or port forwarding needed (none in a sandbox);
# the ports come from the image's environment variables.
"${engine[@]}" run -d --name "$name" --read-only --tmpfs /tmp --user 10001:10001 \
  --network host -e KVSERVE_HTTP_PORT="$http_port" -e KVSERVE_GRPC_PORT="$grpc_port" \
  -v "$model":/models:ro ${run_flags[@]+"${run_flags[@]}"} "$image" \
  --set server.host=127.0.0.1 --set scheduler.max_num_seqs=1

started=$(date +%s.%N)
for _ in $(seq 1 600); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$base/health" || true)
  [[ "$code" == 200 ]] && break
  if [[ "$("${engine[@]}" inspect --format '{{.State.Running}}' "$name")" != true ]]; then
    "${engine[@]}" logs "$name" | tail -20
    fail "the container exited before /health was 200"
  fi
  sleep 0.1
done
[[ "$code" == 200 ]] || fail "/health never became 200"
awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "ready: /health 200 after %.1f s\n", b - a }'
"${engine[@]}" exec "$name" sh -c 'echo "uid $(id -u) gid $(id -g)"; touch /probe 2>&1 || true'

step "completion (temperature 0) equals golden_greedy_256.txt"
curl -sf "$base/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"stories260k","prompt":"","max_tokens":256,"temperature":0}' >/tmp/$name.json
"$python" - "$golden" /tmp/$name.json <<'EOF'
import json, sys
want = open(sys.argv[1]).read().rstrip("\n")
got = json.load(open(sys.argv[2]))["choices"][0]["text"]
print("text:", repr(got[:60]), "...", len(got), "chars")
sys.exit(0 if got == want else "completion differs from the golden text")
EOF

step "gRPC health check"
"$python" - "127.0.0.1:$grpc_port" <<'EOF'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary("/grpc.health.v1.Health/Check")  # raw bytes in and out
resp = check(b"", timeout=10)  # HealthCheckRequest{service: ""}
print("grpc.health.v1.Health/Check ->", resp.hex(), "(0801 = SERVING)")
sys.exit(0 if resp == b"\x08\x01" else "not SERVING")
EOF

step "the image's HEALTHCHECK command"
if [[ "${engine[0]}" == podman ]]; then
  "${engine[@]}" healthcheck run "$name" && echo "podman healthcheck run: healthy"
else
  for _ in $(seq 1 30); do
    status=$(docker inspect --format '{{.State.Health.Status}}' "$name")
    [[ "$status" == healthy ]] && break
    sleep 1
  done
  echo "docker health status: $status"
  [[ "$status" == healthy ]] || fail "HEALTHCHECK did not report healthy"
fi

step "SIGTERM with streams in flight: drains, then exits 0"
# One sequence at a time (scheduler.max_num_seqs=1 above): 32 long streams
# queue up, and SIGTERM comes once at least 8 wait. The signal goes straight
# to the container's PID 1 (kvserve), as `docker stop` / `podman stop` send
# it, without the engine's start-up delay. Streams the daemon accepted must
# end with [DONE]; any sent after SIGTERM must get 503 "draining".
pid1=$("${engine[@]}" inspect --format '{{.State.Pid}}' "$name")
n=32
pids=()
for i in $(seq 1 $n); do
  curl -sN "$base/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"stories260k","prompt":"Once upon a time","max_tokens":440,"ignore_eos":true,"temperature":0,"stream":true}' \
    >"/tmp/$name.$i.sse" &
  pids+=($!)
done
queued=0
for _ in $(seq 1 500); do
  queued=$(curl -s "$base/metrics" | awk '$1 == "kvserve_queue_length" { print int($2) }')
  [[ "${queued:-0}" -ge 8 ]] && break
  sleep 0.005
done
kill -TERM "$pid1"
echo "SIGTERM with $queued requests queued"
sleep 0.02
echo "after SIGTERM: /health $(curl -s -o /dev/null -w '%{http_code}' "$base/health")," \
     "new completion $(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -H 'Content-Type: application/json' -d '{"model":"stories260k","prompt":"x","max_tokens":4}')"
done_streams=0
refused=0
for i in $(seq 1 $n); do
  wait "${pids[$((i - 1))]}" || fail "stream $i was cut (curl failed)"
  if grep -q '"code":"draining"' "/tmp/$name.$i.sse"; then
    refused=$((refused + 1))
    continue
  fi
  last=$(grep '^data: ' "/tmp/$name.$i.sse" | tail -n1)
  events=$(grep -c '^data: ' "/tmp/$name.$i.sse" || true)
  text=$(grep '^data: {' "/tmp/$name.$i.sse" | sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' | md5sum)
  first_text=${first_text:-$text}
  [[ "$last" == "data: [DONE]" && "$text" == "$first_text" ]] ||
    fail "stream $i: $events events, last '$last', text differs from the first stream's"
  done_streams=$((done_streams + 1))
done
echo "streams: $done_streams complete ($events events each, the same text, [DONE] last), $refused refused with 503 draining"
[[ "$queued" -ge 8 ]] || fail "fewer than 8 requests were queued at SIGTERM"
exit_code=$("${engine[@]}" wait "$name")
echo "container exit code: $exit_code"
"${engine[@]}" logs "$name" 2>&1 | grep -E 'draining|stopped|calls still open' | cut -c1-200
[[ "$exit_code" == 0 ]] || fail "exit code $exit_code"
rm -f /tmp/$name.json /tmp/$name.*.sse
echo
echo "test-image: OK"
