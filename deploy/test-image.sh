#!/usr/bin/env bash
# Runs a built kvserve CPU image the way a deployment does and checks it:
#   - no compiler, node, nginx, prometheus or -dev package in the image;
#   - read-only root filesystem, as the image's non-root user (10001), the
#     reference model mounted read-only at /models, /tmp a tmpfs;
#   - GET /health becomes 200, a temperature-0 completion equals
#     golden_greedy_256.txt byte for byte, the gRPC health check answers
#     SERVING, the image's HEALTHCHECK command passes;
#   - SIGTERM while a long stream is in flight: /health turns 503, new
#     completions get 503, the stream still ends with [DONE], the container
#     exits 0 ("drained").
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
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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
"${engine[@]}" run --rm ${run_flags[@]+"${run_flags[@]}"} --network host --entrypoint dpkg-query "$image" \
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
python3 - "$golden" /tmp/$name.json <<'EOF'
import json, sys
want = open(sys.argv[1]).read().rstrip("\n")
got = json.load(open(sys.argv[2]))["choices"][0]["text"]
print("text:", repr(got[:60]), "...", len(got), "chars")
sys.exit(0 if got == want else "completion differs from the golden text")
EOF

step "gRPC health check"
python3 - "127.0.0.1:$grpc_port" <<'EOF'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary("/grpc.health.v1.Health/Check")  # raw bytes in and out
resp = check(b"", timeout=10)  # HealthCheckRequest{service: ""}
print("grpc.health.v1.Health/Check ->", resp.hex(), "(0801 = SERVING)")
sys.exit(0 if resp == b"\x08\x01" else "not SERVING")
EOF

step "the image's HEALTHCHECK command"
"${engine[@]}" exec "$name" bash -c 'exec 3<>/dev/tcp/127.0.0.1/${KVSERVE_HTTP_PORT} && printf "GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n" >&3 && head -n1 <&3 | grep -q " 200 "' &&
  echo "healthcheck: exit 0 (healthy)"

step "SIGTERM with streams in flight: drains, then exits 0"
# One sequence at a time (scheduler.max_num_seqs=1 above): of four long
# streams, three are still queued or running when SIGTERM comes.
pids=()
for i in 1 2 3 4; do
  curl -sN "$base/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"stories260k","prompt":"Once upon a time","max_tokens":440,"ignore_eos":true,"temperature":0,"stream":true}' \
    >"/tmp/$name.$i.sse" &
  pids+=($!)
done
for _ in $(seq 1 100); do grep -q '^data: ' "/tmp/$name.1.sse" 2>/dev/null && break; sleep 0.02; done
"${engine[@]}" kill --signal TERM "$name" >/dev/null
sleep 0.2
echo "after SIGTERM: /health $(curl -s -o /dev/null -w '%{http_code}' "$base/health")," \
     "new completion $(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -H 'Content-Type: application/json' -d '{"model":"stories260k","prompt":"x","max_tokens":4}')"
for i in 1 2 3 4; do
  wait "${pids[$((i - 1))]}" || fail "stream $i was cut"
  events=$(grep -c '^data: ' "/tmp/$name.$i.sse" || true)
  last=$(grep '^data: ' "/tmp/$name.$i.sse" | tail -n1)
  echo "stream $i: $events events, last: $last"
  [[ "$last" == "data: [DONE]" ]] || fail "stream $i did not end with [DONE]"
done
exit_code=$("${engine[@]}" wait "$name")
echo "container exit code: $exit_code"
"${engine[@]}" logs "$name" 2>&1 | grep -E 'draining|stopped' | cut -c1-200
[[ "$exit_code" == 0 ]] || fail "exit code $exit_code"
rm -f /tmp/$name.json /tmp/$name.*.sse
echo
echo "test-image: OK"
