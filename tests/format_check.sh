#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA source differs from what clang-format makes
# of it with the repository's .clang-format (make test runs it as the ctest
# entry format_check). Fix a failure with `make format`.
# The style is clang-format 14's (Debian bookworm); another major version
# formats some constructs differently, so it skips (exit 77) rather than fail.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "format_check: clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [[ "$major" != "14" ]]; then
  echo "format_check: clang-format $major is not the style's version 14: skipped" >&2
  exit 77
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o \
    -path '*/node_modules' -prune -o \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
out=$(mktemp)
if clang-format --dry-run -Werror "${files[@]}" 2>"$out"; then
  rm -f "$out"
  echo "format_check: ${#files[@]} files formatted"
  exit 0
fi
echo "format_check: these files differ from clang-format's output (run make format):" >&2
grep -o '^[^:]*:[0-9]*:[0-9]*: error' "$out" | cut -d: -f1 | sort -u >&2
rm -f "$out"
exit 1
