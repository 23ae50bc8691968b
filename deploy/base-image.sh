#!/usr/bin/env bash
# Makes the Dockerfiles' base image (debian:bookworm-slim) without a
# registry: debootstrap a minimal Debian bookworm from the apt mirror this
# machine already uses, and commit it into buildah's local storage under the
# name the Dockerfiles pull, docker.io/library/debian:bookworm-slim, so that
# `buildah bud --pull=never` finds it there.
#
#   deploy/base-image.sh [--force]
#
# Root only (debootstrap and vfs storage need it). Environment:
#   DEBIAN_MIRROR   the mirror to debootstrap from; default: the first
#                   bookworm source in /etc/apt/sources.list{,.d/*}
#   STORAGE_DRIVER  buildah's storage driver; default vfs (see deploy/README.md)
# Does nothing when the image is already there, unless --force.
set -euo pipefail

image=docker.io/library/debian:bookworm-slim
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
force=0
[[ "${1:-}" == "--force" ]] && force=1

if [[ $force -eq 0 ]] && buildah inspect --type image "$image" >/dev/null 2>&1; then
  echo "base-image: $image is already in local storage" >&2
  exit 0
fi

# The mirror: a one-line "deb URL bookworm ..." or a deb822 "URIs:" stanza
# whose Suites name bookworm (not the security archive, which has no
# installer data for debootstrap).
find_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
         /Suites:[^\n]*bookworm([ \n]|$)/ {
           for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) { split($i, u, " "); print u[2]; exit }
         }' "$f"
  done
}
mirror=${DEBIAN_MIRROR:-$(find_mirror | head -n1)}
if [[ -z "$mirror" ]]; then
  echo "base-image: no bookworm mirror in /etc/apt/sources.list*; set DEBIAN_MIRROR" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
echo "base-image: debootstrap bookworm (minbase) from $mirror" >&2
debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$mirror" >&2

# What the official -slim image does: no documentation, man pages or
# locales from later installs, and an empty apt cache.
mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d"
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'APT::Install-Recommends "false";' >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
find "$rootfs/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete 2>/dev/null || true
rm -rf "$rootfs/usr/share/man"/* "$rootfs/usr/share/info"/* "$rootfs/var/cache/apt"/*.bin \
       "$rootfs/var/cache/apt/archives"/*.deb "$rootfs/var/lib/apt/lists"/* "$rootfs/var/log"/*.log

ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
tar -C "$rootfs" -cf - . | tar -C "$mnt" -xpf -
buildah umount "$ctr" >/dev/null
buildah config --cmd '["bash"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
buildah commit --rm "$ctr" "$image" >&2
echo "base-image: committed $image" >&2
