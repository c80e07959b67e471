# make demo   install what is missing, build, run two agents and move verified data
# make test   install what is missing, build, run every test (ctest)
# make bench  install what is missing, build, run the benchmark suite
# make soak   install what is missing, build, run the soak (minutes; not part of make test)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-unit bench soak format-check clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	$(BUILD)/client/ferry-demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -L unit

# The standard suite (loopback, baselines in the same run), the staging suite and the
# fairness suite; results in bench/results/<date>.{json,txt,png} and <date>-<suite>.{json,txt}.
bench: build
	mkdir -p bench/results
	$(BUILD)/bench/ferry-bench --suite standard --out bench/results
	$(BUILD)/bench/ferry-bench --suite staging --out bench/results
	$(BUILD)/bench/ferry-bench --suite fairness --out bench/results
	$(BUILD)/bench/ferry-bench --rails 4 --out bench/results
	$(BUILD)/bench/ferry-bench --suite security --out bench/results
	$(BUILD)/bench/ferry-engine-bench | tee bench/results/$$(date +%F)-engine.txt

# Not part of `make test`: 64 clients x 1000 WRITE+READ of random sizes with checksums, the
# receiving agent restarted 3 times; prints mismatches (must be 0), errors by code, RSS.
soak: build
	$(BUILD)/bench/ferry-soak --clients 64 --iterations 1000 --restarts 3

# What CI checks first: every C++ line within .clang-format's 100 columns.
format-check:
	scripts/check-format

clean:
	rm -rf $(BUILD)
