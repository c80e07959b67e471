# make demo   install what is missing, build, run two agents and move verified data
# make test   install what is missing, build, run every test (ctest)
# make bench  install what is missing, build, run the benchmark suite
# make soak   install what is missing, build, run the soak (minutes; not part of make test)
# make test-asan  build-asan (ASan + UBSan, -O1): the unit and integration suites
# make test-tsan  build-tsan (TSan, -O1): the engine and provider tests
# make fuzz       build-fuzz (clang-14 libFuzzer): each fuzz target FUZZ_SECONDS over its corpus
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-unit bench soak format-check clean \
	test-asan test-tsan fuzz

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
	$(BUILD)/bench/ferry-engine-bench | tee bench/results/$$(date +%F)-engine.txt

# Not part of `make test`: 64 clients x 1000 WRITE+READ of random sizes with checksums, the
# receiving agent restarted 3 times; prints mismatches (must be 0), errors by code, RSS.
soak: build
	$(BUILD)/bench/ferry-soak --clients 64 --iterations 1000 --restarts 3

# Sanitizer builds: test code only (no bench, no Python module: python3 cannot load an
# ASan/TSan runtime it was not started with), no CUDA (the GPU tests skip without a GPU
# anyway), -O1 to keep the 2-core CI run short while keeping stacks readable.
SAN_CMAKE = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
	-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
	-DFERRY_PYTHON=OFF -DFERRY_BENCH=OFF -DFERRY_CUDA=OFF $(CMAKE_FLAGS)
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer
TSAN_FLAGS = -fsanitize=thread -fno-omit-frame-pointer

build-asan/CMakeCache.txt:
	cmake -S . -B build-asan $(SAN_CMAKE) \
	  -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" -DCMAKE_C_FLAGS="$(ASAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(ASAN_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(ASAN_FLAGS)"

# Every unit and integration test but those labelled `nosan` (tests/CMakeLists.txt says why
# each is). Any report stops the test with a stack (halt_on_error), so ctest fails it.
test-asan: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j$(JOBS)
	cd build-asan && \
	  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) --timeout 900 -L 'unit|integration' -LE nosan

build-tsan/CMakeCache.txt:
	cmake -S . -B build-tsan $(SAN_CMAKE) \
	  -DCMAKE_CXX_FLAGS="$(TSAN_FLAGS)" -DCMAKE_C_FLAGS="$(TSAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(TSAN_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(TSAN_FLAGS)" \
	  -DFERRY_TSAN_ABSL_SHIM=ON

# The engine and provider tests (label `tsan`): the code with threads of its own.
test-tsan: deps build-tsan/CMakeCache.txt
	cmake --build build-tsan -j$(JOBS) --target tsan_tests
	cd build-tsan && \
	  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/sanitizers/tsan.supp \
	  ctest --output-on-failure -j$(JOBS) --timeout 900 -L tsan

# libFuzzer targets built by clang-14 (every ferry library instrumented; FERRY_FUZZ in
# CMakeLists.txt), each run FUZZ_SECONDS over its seeds (tests/fuzz/corpus/<name>): fails on
# the first crash, leak, UB or broken invariant, leaving the input in build-fuzz/artifacts/.
FUZZ_SECONDS ?= 60
FUZZ_CXX ?= clang++-14
FUZZ_CC ?= clang-14

build-fuzz/CMakeCache.txt:
	cmake -S . -B build-fuzz $(SAN_CMAKE) -DFERRY_FUZZ=ON \
	  -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) -DCMAKE_C_COMPILER=$(FUZZ_CC)

fuzz: deps build-fuzz/CMakeCache.txt
	cmake --build build-fuzz -j$(JOBS) --target fuzz_targets
	scripts/run-fuzzers build-fuzz $(FUZZ_SECONDS)

# What CI checks first: every C++ line within .clang-format's 100 columns.
format-check:
	scripts/check-format

clean:
	rm -rf $(BUILD)
