#!/usr/bin/env bash
# Prints the packages (Debian or Ubuntu) that own the shared libraries a
# binary loads, one name a line: what its runtime image has to install.
#   deploy/runtime-packages.sh build/kvserve
# Fails, naming the library, when one is missing or owned by no package.
# The NVIDIA driver's own libraries (libcuda, libnvidia-*) are exempt: the
# container runtime mounts them from the host, so a build image lacks them.
set -euo pipefail

binary=${1:?usage: runtime-packages.sh BINARY}
deps=$(ldd "$binary")
unresolved=$(grep 'not found' <<<"$deps" | grep -Ev 'libcuda\.so|libnvidia-' || true)
if [[ -n "$unresolved" ]]; then
  echo "runtime-packages: $binary has unresolved libraries:" >&2
  echo "$unresolved" >&2
  exit 1
fi
# With a merged /usr, dpkg knows a file under the path its package ships
# (/lib/... or /usr/lib/...), so try the path ld.so found, then the real one.
awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$deps" | while read -r lib; do
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) || {
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  }
  head -n1 <<<"$owner" | cut -d: -f1
done | sort -u
