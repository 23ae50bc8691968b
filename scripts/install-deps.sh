#!/usr/bin/env bash
# Installs kvserve's build and test dependencies from Debian's packages.
# Idempotent and non-interactive: packages already present are skipped, and
# apt is not touched at all when nothing is missing.
set -euo pipefail

# clang and libclang-rt-14-dev (libFuzzer and clang's sanitizer runtimes):
# the fuzz targets of tests/fuzz; gcc's ASan/UBSan come with build-essential.
packages=(
  build-essential cmake pkg-config curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev nlohmann-json3-dev libsentencepiece-dev catch2
  libyaml-cpp-dev libcpp-httplib-dev prometheus-cpp-dev libpcre2-dev libutf8proc-dev
  libbenchmark-dev python3 python3-grpcio python3-numpy nodejs npm prometheus nginx
  gnuplot-nox
  clang libclang-rt-14-dev
  libboost-dev libssl-dev openssl
)
if [[ "${KVSERVE_DEPS_EXTRA:-}" != "" ]]; then
  read -r -a extra <<<"${KVSERVE_DEPS_EXTRA}"
  packages+=("${extra[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # A tool may come from elsewhere (node from nodesource, npm bundled with it).
    case "$p" in
      nodejs) command -v node >/dev/null 2>&1 && continue ;;
      npm) command -v npm >/dev/null 2>&1 && continue ;;
      cmake) command -v cmake >/dev/null 2>&1 && continue ;;
    esac
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
