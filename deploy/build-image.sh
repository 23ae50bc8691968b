#!/usr/bin/env bash
# Builds a kvserve image: `make image` (CPU) runs this.
#
#   deploy/build-image.sh [cpu|cuda] [NAME:TAG]      (default: cpu kvserve:cpu)
#
# With a Docker engine (`docker info` answers): `docker build`. Otherwise,
# on Debian as root, with buildah (installed here from Debian's packages
# when missing) and no registry: the base image debian:bookworm-slim is
# made with debootstrap from the apt mirror (deploy/base-image.sh), then
#   buildah bud --format docker --pull=never --isolation chroot ...
# deploy/README.md ("Building without Docker") explains each flag.
# Environment: KVSERVE_IMAGE_ENGINE=docker|buildah forces one;
# KVSERVE_BUILD_ULIMITS overrides the --ulimit flags given to buildah.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
variant=${1:-cpu}
tag=${2:-kvserve:$variant}
case "$variant" in
  cpu|cuda) ;;
  *) echo "build-image: unknown variant '$variant' (cpu or cuda)" >&2; exit 2 ;;
esac
dockerfile=deploy/Dockerfile.$variant
cd "$repo"

engine=${KVSERVE_IMAGE_ENGINE:-}
if [[ -z "$engine" ]]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=docker
  else
    engine=buildah
  fi
fi

if [[ "$engine" == docker ]]; then
  echo "build-image: docker build -f $dockerfile -t $tag ." >&2
  exec docker build -f "$dockerfile" -t "$tag" .
fi

# --- buildah -----------------------------------------------------------------
if [[ $(id -u) -ne 0 ]]; then
  echo "build-image: no Docker engine, and building with buildah here needs root" \
       "(vfs storage, chroot isolation, debootstrap)" >&2
  exit 1
fi
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v runc >/dev/null 2>&1 || need+=(runc)
if [[ ${#need[@]} -gt 0 ]]; then
  echo "build-image: installing ${need[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# vfs: plain directory copies, no overlay mounts (which a container sandbox
# or an overlay-backed root usually refuses). Slow and large, but it works
# everywhere.
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
# chroot: RUN steps run in a chroot with the host's network, without new
# namespaces or cgroups that an unprivileged or nested sandbox cannot make.
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

bash deploy/base-image.sh

# Resource limits: buildah leaves a RUN step the limits it runs with itself.
# A --ulimit above the sandbox's hard limit fails the step ("setting
# RLIMIT_NPROC ... operation not permitted": the chroot has dropped
# CAP_SYS_RESOURCE by then), so none is given unless asked for, e.g.
#   KVSERVE_BUILD_ULIMITS="--ulimit nofile=4096:4096"
read -r -a ulimits <<<"${KVSERVE_BUILD_ULIMITS:-}"

# --format docker: the OCI image format has no HEALTHCHECK; Docker's keeps it.
# --pull=never: the base image is the local one, never a registry's.
set -x
buildah bud --format docker --pull=never --isolation "$BUILDAH_ISOLATION" ${ulimits[@]+"${ulimits[@]}"} \
  --layers=false --ignorefile "$dockerfile.dockerignore" -f "$dockerfile" -t "$tag" .
set +x
buildah images "$tag" >&2
