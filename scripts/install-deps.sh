#!/usr/bin/env bash
# Installs kvserve's dependencies from Debian's packages: with --run only
# what building and running the daemon needs (`make run`), else those and
# everything the tests, benchmarks and fuzzers use (`make test`).
# Idempotent and non-interactive: packages already present are skipped, and
# apt is not touched at all when nothing is missing.
set -euo pipefail

# Building the daemon (curl fetches the reference model where ../shared has none).
packages=(
  build-essential cmake pkg-config curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev nlohmann-json3-dev libsentencepiece-dev
  libyaml-cpp-dev prometheus-cpp-dev libpcre2-dev libutf8proc-dev
  libboost-dev libssl-dev libhiredis-dev
)
# The tests and benchmarks: Catch2, cpp-httplib (the tests' HTTP client),
# Google Benchmark, Python grpcio/numpy (reference clients and forward
# passes), node + npm (JS references, manifest schemas), prometheus
# (promtool), nginx (the load-balancer tests), gnuplot (study plots), openssl
# (test certificates), redis-server (the remote KV tier's tests),
# clang-format (make test checks the tree is formatted), clang and
# libclang-rt-14-dev (libFuzzer and clang's sanitizer runtimes for
# tests/fuzz; gcc's ASan/UBSan come with build-essential).
if [[ "${1:-}" != "--run" ]]; then
  packages+=(
    catch2 libcpp-httplib-dev libbenchmark-dev python3 python3-grpcio python3-numpy
    nodejs npm prometheus nginx gnuplot-nox openssl redis-server clang-format clang
    libclang-rt-14-dev
  )
fi
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
