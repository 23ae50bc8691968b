# The two quick-start commands: `make run` and `make test`. Both install what
# is missing (Debian packages, idempotently), then build.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
CONFIG ?= configs/default.yaml

.PHONY: all deps build run test bench clean format

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	@model_dir=$$(bash scripts/fetch-model.sh stories260k) && \
	  if [ -f $(CONFIG) ] && $(BUILD_DIR)/kvserve serve --help >/dev/null 2>&1; then \
	    exec $(BUILD_DIR)/kvserve serve --config $(CONFIG); \
	  else \
	    exec $(BUILD_DIR)/kvserve generate --model $$model_dir/stories260K.bin \
	      --prompt "Once upon a time" --max-tokens 200 --temperature 0; \
	  fi

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) --timeout 1200

bench: build
	@bash bench/run.sh $(BUILD_DIR)

format:
	git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
