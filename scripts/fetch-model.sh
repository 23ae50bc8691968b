#!/usr/bin/env bash
# Prints the directory that holds a reference model, fetching it when needed.
#   scripts/fetch-model.sh stories260k
# Order: $KVSERVE_SHARED/models/NAME, ../shared/models/NAME (beside the
# repository), then ~/.cache/kvserve/models/NAME, downloading from the
# Hugging Face repository karpathy/tinyllamas when absent. Weights are never
# committed to the repository.
set -euo pipefail
name="${1:-stories260k}"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

case "$name" in
  stories260k) files=(stories260K.bin tok512.model) ; remote="stories260K" ;;
  *) echo "fetch-model: unknown model '$name' (known: stories260k)" >&2; exit 2 ;;
esac

have_all() { local d="$1"; for f in "${files[@]}"; do [[ -f "$d/$f" ]] || return 1; done; }

for d in "${KVSERVE_SHARED:+$KVSERVE_SHARED/models/$name}" "$repo_root/../shared/models/$name"; do
  if [[ -n "$d" ]] && have_all "$d"; then (cd "$d" && pwd); exit 0; fi
done

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvserve/models/$name"
if ! have_all "$cache"; then
  mkdir -p "$cache"
  for f in "${files[@]}"; do
    if [[ ! -f "$cache/$f" ]]; then
      echo "fetch-model: downloading $f" >&2
      curl -fsSL --retry 3 -o "$cache/$f.part" \
        "https://huggingface.co/karpathy/tinyllamas/resolve/main/$remote/$f"
      mv "$cache/$f.part" "$cache/$f"
    fi
  done
fi
echo "$cache"
