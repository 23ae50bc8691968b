# The two quick-start commands: `make run` and `make test`. Both install what
# is missing (Debian packages, idempotently), then build.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
CONFIG ?= configs/default.yaml

.PHONY: all deps deps-run build build-daemon run test test-sanitize test-tsan-sim fuzz soak bench bench-eviction bench-weights bench-tiers bench-tiers-serve bench-grammar image clean format

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

# `make run` builds in its own folder: without a visible GPU it leaves the
# CUDA kernels out (the default config runs on the CPU), which halves a first
# start; `make test` keeps compiling them in $(BUILD_DIR).
RUN_BUILD_DIR ?= build-run
RUN_CUDA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo AUTO || echo OFF)

$(RUN_BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(RUN_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DKVSERVE_CUDA=$(RUN_CUDA) \
	  -DKVSERVE_BUILD_TESTS=OFF -DKVSERVE_BUILD_BENCH=OFF $(CMAKE_FLAGS)

# Only the daemon's own dependencies: no test tools.
deps-run:
	@bash scripts/install-deps.sh --run

run: deps-run $(RUN_BUILD_DIR)/CMakeCache.txt
	cmake --build $(RUN_BUILD_DIR) -j$(JOBS) --target kvserve
	@model_dir=$$(bash scripts/fetch-model.sh stories260k) && \
	  export KVSERVE_MODEL_DIR=$$model_dir && exec $(RUN_BUILD_DIR)/kvserve serve --config $(CONFIG)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 1200

# The unit and integration tests built with AddressSanitizer (LeakSanitizer
# included) and UndefinedBehaviorSanitizer, CUDA off, in $(ASAN_BUILD_DIR).
# SANITIZE_TESTS, a ctest -R regex, runs a subset (empty: every test), and
# SANITIZE_TARGETS builds only the binaries it needs (empty: all);
# SANITIZE_EXCLUDE, a ctest -E regex, leaves tests out.
# Leaks of third-party libraries are suppressed in tests/sanitize/lsan.supp.
ASAN_BUILD_DIR ?= build-asan
SANITIZE_TESTS ?=
SANITIZE_TARGETS ?=
SANITIZE_EXCLUDE ?=
SANITIZE_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=0 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

$(ASAN_BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DKVSERVE_CUDA=OFF \
	  -DKVSERVE_SANITIZE=address,undefined $(CMAKE_FLAGS)

test-sanitize: deps $(ASAN_BUILD_DIR)/CMakeCache.txt
	cmake --build $(ASAN_BUILD_DIR) -j$(JOBS) $(if $(SANITIZE_TARGETS),--target $(SANITIZE_TARGETS))
	cd $(ASAN_BUILD_DIR) && $(SANITIZE_ENV) ctest --output-on-failure -j$(JOBS) --timeout 2400 \
	  $(if $(SANITIZE_TESTS),-R '$(SANITIZE_TESTS)') $(if $(SANITIZE_EXCLUDE),-E '$(SANITIZE_EXCLUDE)')

# The CUDA simulator's tests (cuda_sim_tests, its fiber-order runs included)
# built with ThreadSanitizer, CUDA off, in $(TSAN_BUILD_DIR): each simulated
# thread is a TSan fiber (tests/kernels/cuda_sim/cuda_sim.h), so a race
# between the threads of a CTA is reported in any fiber order; the planted
# one of race_selftest_test must be. Through ccache when there is one.
TSAN_BUILD_DIR ?= build-tsan
CCACHE_FLAGS = $(if $(shell command -v ccache 2>/dev/null),-DCMAKE_C_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

$(TSAN_BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DKVSERVE_CUDA=OFF \
	  -DKVSERVE_SANITIZE=thread $(CCACHE_FLAGS) $(CMAKE_FLAGS)

test-tsan-sim: deps $(TSAN_BUILD_DIR)/CMakeCache.txt
	cmake --build $(TSAN_BUILD_DIR) -j$(JOBS) --target cuda_sim_tests
	cd $(TSAN_BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 2400 -R '^cuda_sim'

# libFuzzer on every parser for FUZZ_SECONDS (default 300) each, in a clang
# build (build-fuzz); the corpus grows in build-fuzz/corpus, crashes land in
# build-fuzz/crashes. See scripts/fuzz.sh and tests/fuzz/CMakeLists.txt.
FUZZ_SECONDS ?= 300
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) bash scripts/fuzz.sh run $(FUZZ_TARGETS)

# 10 minutes of mixed HTTP/gRPC load with faults, 5 in each preemption mode
# (scripts/soak.sh; SOAK_SECONDS per mode). make test runs 30 s of each.
SOAK_SECONDS ?= 300
soak: build-daemon
	SOAK_SECONDS=$(SOAK_SECONDS) bash scripts/soak.sh $(BUILD_DIR)

bench: build
	@bash bench/run.sh $(BUILD_DIR)

# KV tiers: a multi-turn chat coming back after other traffic filled the
# pool, TTFT and hit rate per tier (bench/tier_bench.cc, docs/kv-tiers.md).
bench-tiers: build
	@$(BUILD_DIR)/bench/tier_bench --json $(BUILD_DIR)/bench/tier_bench.json

# KV tiers served: real daemons, a Redis, two replicas behind nginx
# round-robin, a 3,000-token document and a multi-turn chat, fp16 / int8 /
# int4_kc pages (bench/tier_serve_bench.sh, ~5-10 minutes; not in make test).
bench-tiers-serve: build
	@bash bench/tier_serve_bench.sh $(BUILD_DIR)

# Constrained decoding's CPU cost: vocabulary trie, schema compile, mask per step.
bench-grammar: $(BUILD_DIR)/CMakeCache.txt
	@bash bench/grammar_bench.sh $(BUILD_DIR)

# The KV eviction study the README reports (long text and budget sweep).
bench-eviction: build
	@bash bench/eviction_study.sh $(BUILD_DIR)

# model.weight_dtype fp32 / int8 / int4: decode and prefill speed at the
# stories110m shape, quality on stories260K (bench/weight_dtypes.sh).
bench-weights: build
	@bash bench/weight_dtypes.sh $(BUILD_DIR)

# The CPU container image (kvserve:cpu): Docker where an engine answers, else
# buildah with a debootstrapped base image (deploy/README.md).
image:
	@bash deploy/build-image.sh cpu

format:
	git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
