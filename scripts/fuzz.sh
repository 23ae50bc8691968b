#!/usr/bin/env bash
# libFuzzer runs of the parsers in tests/fuzz (clang, ASan + UBSan).
#
#   scripts/fuzz.sh build [target...]      configure (once) and build the targets
#   scripts/fuzz.sh smoke target           a few seconds from the seed corpus (make test
#                                          replays the seeds without libFuzzer instead:
#                                          tests/fuzz/replay_main.cc)
#   scripts/fuzz.sh run [target...]        FUZZ_SECONDS (default 300) per target (make fuzz)
#
# Targets: openai_request serve_config safetensors llama2c_header tokenizer
# (all when none is named). FUZZ_BUILD_DIR is the clang build directory
# (default build-fuzz). `run` keeps its growing corpus in
# $FUZZ_BUILD_DIR/corpus/<target> (seeded from tests/fuzz/corpus/<target>)
# and writes crashes to $FUZZ_BUILD_DIR/crashes/<target>/; a crash makes the
# script fail, and its input should become a Catch2 regression test.
# Each run prints "fuzz <target>: N runs in S s, E exec/s".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${JOBS:-2}
all_targets=(openai_request serve_config safetensors llama2c_header tokenizer)

configure() {
  if [[ -f "$build/CMakeCache.txt" ]]; then return; fi
  local cc=${FUZZ_CC:-clang} cxx=${FUZZ_CXX:-clang++}
  if ! command -v "$cxx" >/dev/null; then
    echo "fuzz.sh: $cxx not found (Debian: clang, libclang-rt-14-dev)" >&2
    exit 1
  fi
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  CC=$cc CXX=$cxx cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVSERVE_FUZZ=ON \
    -DKVSERVE_SANITIZE=address,undefined -DKVSERVE_CUDA=OFF -DKVSERVE_BUILD_TESTS=OFF \
    -DKVSERVE_BUILD_BENCH=OFF "${launcher[@]}" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log" >&2; exit 1; }
}

build_targets() {
  configure
  local names=()
  for t in "$@"; do names+=("fuzz_$t"); done
  cmake --build "$build" -j"$jobs" --target "${names[@]}"
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# fuzz_one target seconds corpus_dir
fuzz_one() {
  local t=$1 secs=$2 corpus=$3
  local bin="$build/fuzz/fuzz_$t" crashes="$build/crashes/$t"
  mkdir -p "$crashes" "$corpus"
  local log
  log=$(mktemp)
  local rc=0
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "$root/tests/fuzz/corpus/$t" \
    >"$log" 2>&1 || rc=$?
  local runs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  local took
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  if [[ $rc -ne 0 || -z "$runs" ]]; then
    tail -60 "$log" >&2
    echo "fuzz $t: FAILED (exit $rc); inputs in $crashes" >&2
    rm -f "$log"
    return 1
  fi
  took=${took:-$secs}
  echo "fuzz $t: $runs runs in ${took} s, $((runs / (took > 0 ? took : 1))) exec/s," \
       "corpus $(ls "$corpus" | wc -l) files"
  rm -f "$log"
}

cmd=${1:-}
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=("${all_targets[@]}"); fi
case "$cmd" in
  build)
    build_targets "${targets[@]}"
    ;;
  smoke)
    # The seeds and what a few seconds find from them, in a scratch corpus.
    build_targets "${targets[@]}" >/dev/null
    for t in "${targets[@]}"; do
      scratch=$(mktemp -d)
      rc=0
      fuzz_one "$t" "${FUZZ_SECONDS:-5}" "$scratch" || rc=$?
      rm -rf "$scratch"
      [[ $rc -eq 0 ]] || exit $rc
    done
    ;;
  run)
    build_targets "${targets[@]}"
    failed=0
    for t in "${targets[@]}"; do
      fuzz_one "$t" "${FUZZ_SECONDS:-300}" "$build/corpus/$t" || failed=1
    done
    exit $failed
    ;;
  *)
    sed -n '2,14p' "$0" >&2
    exit 2
    ;;
esac
