# The two quick-start commands: `make run` and `make test`. Both install what
# is missing (Debian packages, idempotently), then build.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
CONFIG ?= configs/default.yaml

.PHONY: all deps build build-daemon run test bench bench-eviction image clean format

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j$(JOBS)

# Only what `make run` starts: no tests, benchmarks or CUDA kernels.
build-daemon: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j$(JOBS) --target kvserve

run: build-daemon
	@model_dir=$$(bash scripts/fetch-model.sh stories260k) && \
	  export KVSERVE_MODEL_DIR=$$model_dir && exec $(BUILD_DIR)/kvserve serve --config $(CONFIG)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 1200

bench: build
	@bash bench/run.sh $(BUILD_DIR)

# The KV eviction study the README reports (long text and budget sweep).
bench-eviction: build
	@bash bench/eviction_study.sh $(BUILD_DIR)

# The CPU container image (kvserve:cpu): Docker where an engine answers, else
# buildah with a debootstrapped base image (deploy/README.md).
image:
	@bash deploy/build-image.sh cpu

format:
	git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
