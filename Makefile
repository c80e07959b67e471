# make demo   install what is missing, build, run two agents and move verified data
# make test   install what is missing, build, run every test (ctest)
# make bench  install what is missing, build, run the benchmark suite
# make soak   install what is missing, build, run the soak (minutes; not part of make test)
# make test-asan  build-asan (clang-14, ASan + UBSan, -O1): the unit and integration suites
# make test-tsan  build-tsan (gcc, TSan, -O1): the engine and provider tests
# make fuzz       build-asan's libFuzzer targets, each FUZZ_SECONDS over its seed corpus
# make test-rdma  the rdma tests, two agents, perftest and faults on a real verbs stack:
#                 Soft-RoCE in two QEMU guests (tests/rdma/; as root; the guest is cached
#                 in FERRY_RDMA_CACHE, default /var/cache/ferry-rdma)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-unit bench soak format-check clean \
	test-asan test-tsan fuzz test-rdma

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

# Skips, saying why, without root, qemu or the kernel package (tests/rdma/test-rdma).
test-rdma: build
	tests/rdma/test-rdma $(BUILD)

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

# Sanitizer builds: test code only (no bench, no Python module: python3 cannot load an
# ASan/TSan runtime it was not started with), no CUDA (the GPU tests skip without a GPU
# anyway), -O1 to keep the 2-core CI run short while keeping stacks readable.
SAN_CMAKE = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
	-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
	-DFERRY_PYTHON=OFF -DFERRY_BENCH=OFF -DFERRY_CUDA=OFF $(CMAKE_FLAGS)
TSAN_FLAGS = -fsanitize=thread -fno-omit-frame-pointer
SAN_CXX ?= clang++-14
SAN_CC ?= clang-14
FUZZ_SECONDS ?= 60
# One clang-14 build serves test-asan and fuzz: FERRY_FUZZ (CMakeLists.txt) compiles every
# target with ASan + UBSan and libFuzzer's coverage hooks (no-ops outside a fuzzer), and
# adds the fuzz_* targets. Two builds of ferry would add a quarter of an hour to CI.
ASAN_BUILD ?= build-asan

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) $(SAN_CMAKE) -DFERRY_FUZZ=ON \
	  -DCMAKE_CXX_COMPILER=$(SAN_CXX) -DCMAKE_C_COMPILER=$(SAN_CC)

# Every unit and integration test but those labelled `nosan` (tests/CMakeLists.txt says why
# each is). Any report stops the test with a stack (halt_on_error; UBSan aborts by itself,
# -fno-sanitize-recover), so ctest fails it.
test-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && \
	  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) --timeout 900 -L 'unit|integration' -LE nosan

# libFuzzer targets, each run FUZZ_SECONDS over its seeds (tests/fuzz/corpus/<name>): fails
# on the first crash, leak, UB or broken invariant, leaving the input in
# $(ASAN_BUILD)/artifacts/.
fuzz: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j$(JOBS) --target fuzz_targets
	scripts/run-fuzzers $(ASAN_BUILD) $(FUZZ_SECONDS)

build-tsan/CMakeCache.txt:
	cmake -S . -B build-tsan $(SAN_CMAKE) \
	  -DCMAKE_CXX_FLAGS="$(TSAN_FLAGS)" -DCMAKE_C_FLAGS="$(TSAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(TSAN_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(TSAN_FLAGS)" \
	  -DFERRY_TSAN_ABSL_SHIM=ON

# The engine and provider tests (label `tsan`): the code with threads of its own.
# intercept_send=0: TSan's sendmsg hook marks the socket "released" before it records the
# reads of the buffers being sent, so a READ answer's payload, sent from the target region,
# looked unordered with the initiator's next use of that region after the answer arrived.
# ignore_noninstrumented_modules: memcpy, malloc and the rest, called from Debian's libraries
# (gRPC, protobuf, Abseil: not built with TSan, so their own synchronisation is invisible),
# are not checked; ferry's code and what is inlined into it are.
TSAN_OPTIONS = halt_on_error=1:second_deadlock_stack=1:intercept_send=0:$\
	ignore_noninstrumented_modules=1:$\
	suppressions=$(CURDIR)/tests/sanitizers/tsan.supp
test-tsan: deps build-tsan/CMakeCache.txt
	cmake --build build-tsan -j$(JOBS) --target tsan_tests
	cd build-tsan && TSAN_OPTIONS=$(TSAN_OPTIONS) \
	  ctest --output-on-failure -j$(JOBS) --timeout 900 -L tsan

# What CI checks first: every C++ line within .clang-format's 100 columns.
format-check:
	scripts/check-format

clean:
	rm -rf $(BUILD)
