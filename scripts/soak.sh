#!/usr/bin/env bash
# Soak: mixed HTTP/gRPC load with disconnects, cancellations, deadlines, n > 1
# and shared prefixes against a KV pool small enough to force preemption, in
# both preemption modes (recompute, then swap), SOAK_SECONDS each (default
# 300: `make soak` is 10 minutes). Prints throughput over time, and checks 0
# active KV blocks at the end, no 5xx, bounded RSS growth and the golden
# request afterwards (tests/soak/soak.py). JSON summaries go to
# BUILD_DIR/soak-<mode>.json.
#
#   scripts/soak.sh [BUILD_DIR]          (default build)
# Environment: SOAK_SECONDS, SOAK_CLIENTS (12), SOAK_NUM_BLOCKS (64),
# SOAK_MAX_RSS_GROWTH_MB (64), SOAK_MODES ("recompute swap").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
python=python3
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import grpc, google.protobuf' 2>/dev/null; then
    python=$p
    break
  fi
done
failed=0
for mode in ${SOAK_MODES:-recompute swap}; do
  "$python" tests/soak/soak.py --kvserve "$build/kvserve" --mode "$mode" \
    --duration "${SOAK_SECONDS:-300}" --clients "${SOAK_CLIENTS:-12}" \
    --num-blocks "${SOAK_NUM_BLOCKS:-64}" --max-rss-growth-mb "${SOAK_MAX_RSS_GROWTH_MB:-64}" \
    --interval "${SOAK_INTERVAL:-10}" --json "$build/soak-$mode.json" || failed=1
done
exit $failed
