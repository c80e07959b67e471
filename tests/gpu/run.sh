#!/usr/bin/env bash
# The GPU checks in one go, for a session lent a GPU machine once: the `gpu` tests (CUDA pool
# slabs, copies with data checks, pinning, DMA-BUF export, CUDA IPC from a second process),
# ferry-gpu-bench (D2H/H2D through NUMA-local pinned bounce chunks vs cudaMemcpy peak) and the
# agent run (tests/gpu/agent_run.sh: two ferryd with the CUDA backend move cuda:0 buffers to
# each other through the staged path, a client maps them by CUDA IPC and checks checksums).
#
#   tests/gpu/run.sh           on the GPU machine, from the repository root
#   tests/gpu/run.sh --pack    on a build machine: build the GPU checks, ferryd and ferryctl
#                              and pack them, with the shared libraries they need, into
#                              ./build-gpu-pack, about 35 MiB (FERRY_GPU_PACK_BUILD: the CUDA
#                              build folder, default ./build-cuda)
#
# Two ways to get binaries on the GPU machine:
#   build: configure with CUDA (CMAKE_CUDA_ARCHITECTURES=90) and build only the GPU targets,
#          all cores. Needs ferry's Debian packages (scripts/install-deps installs missing ones
#          when it can; a machine without a package registry cannot).
#   pack:  run what `--pack` made elsewhere (carry ./build-gpu-pack along). Used when that
#          folder exists, since a GPU machine often lacks the -dev packages and the network.
# FERRY_GPU_MODE=build|pack forces one. FERRY_GPU_JOBS: build jobs (default: every core).
# FERRY_GPU_BACKEND=sim: bench and agent run on simulated GPUs, a dry run of this script on a
# machine without a GPU (the gpu tests then skip). Everything (logs, test XML, bench table and
# JSON, agent logs, nvidia-smi) goes under $OUT if set, else ./gpu-results; a summary is
# printed at the end. The whole run keeps within 10 minutes: each stage gets what is left.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
pack_dir=$root/build-gpu-pack
gpu_targets=(gpu_memory_test gpu_vmm_test gpu_ipc_helper ferry-gpu-bench ferryd ferryctl gpu_staged_client)
jobs=${FERRY_GPU_JOBS:-$(nproc)}
backend=${FERRY_GPU_BACKEND:-cuda}

if [ "${1:-}" = "--pack" ]; then
  set -e
  build=${FERRY_GPU_PACK_BUILD:-$root/build-cuda}
  [ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DFERRY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
  cmake --build "$build" -j"$jobs" --target "${gpu_targets[@]}"
  grep -q "transport/memory/cuda_gpu.cc" "$build/compile_commands.json" ||
    { echo "run.sh --pack: $build was not configured with CUDA" >&2; exit 1; }
  rm -rf "$pack_dir"
  mkdir -p "$pack_dir/lib"
  bins=("$build/tests/gpu_memory_test" "$build/tests/gpu_vmm_test" "$build/tests/gpu_ipc_helper"
        "$build/bench/ferry-gpu-bench"
        "$build/server/ferryd" "$build/client/ferryctl" "$build/tests/gpu_staged_client")
  cp "${bins[@]}" "$pack_dir/"
  packed=()
  for b in "${bins[@]}"; do packed+=("$pack_dir/$(basename "$b")"); done
  command -v strip > /dev/null && strip --strip-debug "${packed[@]}"
  # Every shared library they load except glibc's own (which cannot travel): the GPU
  # machine's distribution need not have Abseil, spdlog, fmt, hwloc, gRPC, protobuf or
  # yaml-cpp at these versions.
  ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$pack_dir/lib/"; done
  git -C "$root" rev-parse HEAD > "$pack_dir/commit" 2>/dev/null || true
  echo "packed into $pack_dir ($(du -sh "$pack_dir" | cut -f1)); carry build-gpu-pack to the GPU machine"
  exit 0
fi

out=${OUT:-$root/gpu-results}
mkdir -p "$out"
log=$out/run.log
exec > >(tee -a "$log") 2>&1
start=$(date +%s)
# Seconds left of the run's 10 minutes (less a margin for the summary), at most $1.
budget=${FERRY_GPU_BUDGET_S:-580}
left() {
  local l=$((budget - ($(date +%s) - start)))
  [ "$l" -gt "$1" ] && l=$1
  [ "$l" -lt 10 ] && l=10
  echo "$l"
}
echo "== ferry GPU checks, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

if command -v nvidia-smi > /dev/null; then
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  nvidia-smi topo -m >> "$out/nvidia-smi.txt" 2>&1
  nvidia-smi -L
else
  echo "nvidia-smi: not found"
fi

mode=${FERRY_GPU_MODE:-}
if [ -z "$mode" ]; then
  if [ -x "$pack_dir/gpu_memory_test" ]; then mode=pack; else mode=build; fi
fi
echo "== mode: $mode, GPU backend for the bench and the agent run: $backend"

status_build=ok
if [ "$mode" = build ]; then
  build=$root/build-gpu
  # Capped: without a package registry apt-get can only fail, and device time is short.
  if ! timeout 60 scripts/install-deps; then
    echo "install-deps: some packages are missing and could not be installed (see above)"
  fi
  gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  if ! cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DFERRY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/build.log" 2>&1 ||
     ! grep -q "ferry: CUDA backend ON" "$out/build.log" ||
     ! timeout "$(left 400)" cmake --build "$build" -j"$jobs" --target "${gpu_targets[@]}" ferry-bench \
       >> "$out/build.log" 2>&1; then
    status_build=failed
    tail -n 30 "$out/build.log"
    echo "build failed (full log: build.log). On a machine without ferry's packages, run"
    echo "'tests/gpu/run.sh --pack' on a build machine and carry build-gpu-pack here."
  fi
  test_bin=$build/tests/gpu_memory_test
  bench_bin=$build/bench/ferry-gpu-bench
  same_node_bin=$build/bench/ferry-bench
  agent_bins=(--ferryd "$build/server/ferryd" --ferryctl "$build/client/ferryctl"
              --client "$build/tests/gpu_staged_client")
else
  export LD_LIBRARY_PATH=$pack_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export FERRY_GPU_IPC_HELPER=$pack_dir/gpu_ipc_helper
  test_bin=$pack_dir/gpu_memory_test
  bench_bin=$pack_dir/ferry-gpu-bench
  agent_bins=(--bin "$pack_dir")
  echo "pack built at commit $(cat "$pack_dir/commit" 2>/dev/null || echo '?')"
  for b in gpu_memory_test gpu_vmm_test gpu_ipc_helper ferry-gpu-bench ferryd ferryctl \
           gpu_staged_client; do
    if [ ! -x "$pack_dir/$b" ]; then
      status_build="pack: $b missing (made by an older run.sh --pack?)"
    elif ldd "$pack_dir/$b" | grep "not found"; then
      status_build="pack: libraries missing"
    fi
  done
fi

status_tests=not-run
if [ "$status_build" = ok ]; then
  echo "== gpu tests"
  if [ "$mode" = build ]; then
    (cd "$build" && timeout "$(left 300)" ctest -L gpu --output-on-failure \
       --output-junit "$out/tests.xml")
  else
    timeout "$(left 300)" "$test_bin" --gtest_output="xml:$out/tests.xml"
    rc=$?
    timeout "$(left 60)" "$pack_dir/gpu_vmm_test" --gtest_output="xml:$out/vmm-tests.xml" ||
      rc=$?
    (exit "$rc")
  fi
  rc=$?
  status_tests=$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (rc $rc)")
fi

status_bench=not-run
if [ "$status_build" = ok ]; then
  echo "== ferry-gpu-bench"
  bench_args=(--backend "$backend")
  # The dry run only proves the plumbing: small and quick on a build machine's few cores.
  [ "$backend" = sim ] && bench_args+=(--total 64MiB --repeat 1)
  timeout "$(left 200)" "$bench_bin" "${bench_args[@]}" --json "$out/bench.json" |
    tee "$out/bench.txt"
  rc=${PIPESTATUS[0]}
  status_bench=$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (rc $rc)")
fi

status_agent=not-run
if [ "$status_build" = ok ]; then
  echo "== agent run: two ferryd, cuda:0 buffers staged between them"
  FERRY_GPU_BACKEND=$backend timeout "$(left 150)" tests/gpu/agent_run.sh "${agent_bins[@]}" \
    --out "$out/agent-run" --peaks "$out/bench.txt"
  rc=$?
  case $rc in
    0) status_agent=ok ;;
    77) status_agent=skipped ;;
    *) status_agent="FAILED (rc $rc)" ;;
  esac
fi

# Same node (the agent copies): GPU -> GPU beside cudaMemcpy D2D, host rows beside memcpy. The
# pack carries no ferry-bench: built here only.
status_same=not-run
if [ "$status_build" = ok ] && [ -n "${same_node_bin:-}" ] && [ "$backend" = cuda ]; then
  echo "== same node: ferry-bench --suite same-node"
  timeout "$(left 120)" "$same_node_bin" --suite same-node --seconds 0.5 2>&1 |
    tee "$out/same-node.txt"
  rc=${PIPESTATUS[0]}
  status_same=$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (rc $rc)")
elif [ "$status_build" = ok ]; then
  status_same="skipped ($([ "$backend" = cuda ] && echo "pack mode carries no ferry-bench" ||
    echo "simulated GPUs"))"
fi

# CUDA torch tensors through the Python package (tests/gpu/python_cuda.py): a CUDA tensor
# outside agent memory sent from its CUDA IPC registration, received into a CUDA tensor. It
# needs the ferry_python target (pybind11) and torch with CUDA; it says why when it skips.
status_python=not-run
if [ "$status_build" = ok ] && [ "$mode" = build ] && [ "$backend" = cuda ]; then
  echo "== python: CUDA torch tensors through send / recv / register"
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if timeout "$(left 200)" cmake --build "$build" -j"$jobs" --target ferry_python \
       >> "$out/build.log" 2>&1; then
    PYTHONPATH=$build/python FERRYD=$build/server/ferryd timeout "$(left 120)" \
      "$py" tests/gpu/python_cuda.py 2>&1 | tee "$out/python-cuda.txt"
    rc=${PIPESTATUS[0]}
    case $rc in
      0) status_python=ok ;;
      77) status_python="skipped ($(sed -n 's/.*skipped (\(.*\))$/\1/p' "$out/python-cuda.txt"))" ;;
      *) status_python="FAILED (rc $rc)" ;;
    esac
  else
    status_python="skipped (no ferry_python target built here: pybind11-dev? build.log)"
  fi
elif [ "$status_build" = ok ]; then
  status_python="skipped ($([ "$backend" = cuda ] && echo "pack mode carries no Python module" ||
    echo "simulated GPUs: make test runs tests/python/test_gpu_tensors.py"))"
fi
echo "python: $status_python"

# ferry.vllm.FerryConnector with CUDA torch KV caches (tests/vllm, test_cuda_caches: TP 1->1
# and 1->2, the caches registered by CUDA IPC, every pulled value checked on the GPU); make
# test runs the same harness on host memory and simulated GPUs, where this case skips.
status_vllm=not-run
if [ "${status_python%% *}" = ok ]; then
  echo "== vllm connector: CUDA torch KV caches"
  if "$py" -c "import pytest" 2> /dev/null; then
    PYTHONPATH=$build/python:tests/vllm FERRYD=$build/server/ferryd timeout "$(left 120)" \
      "$py" -m pytest -q -rs -p no:cacheprovider -k test_cuda_caches tests/vllm 2>&1 |
      tee "$out/vllm-cuda.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ] && grep -q " passed" "$out/vllm-cuda.txt"; then
      status_vllm="ok ($(grep -Eo "[0-9]+ passed[^=]*" "$out/vllm-cuda.txt" | tail -1))"
    elif [ "$rc" -eq 0 ]; then
      status_vllm="skipped ($(sed -n 's/^SKIPPED \[[0-9]*\] [^:]*:[0-9]*: //p' \
        "$out/vllm-cuda.txt" | head -1))"
    else
      status_vllm="FAILED (rc $rc)"
    fi
  else
    status_vllm="skipped ($py has no pytest: python3-pytest)"
  fi
else
  status_vllm="skipped (the python CUDA check did not pass: ${status_python})"
fi
echo "vllm connector: $status_vllm"

echo
echo "== summary ($(($(date +%s) - start)) s; results in $out)"
echo "build: $status_build ($mode)"
echo "tests: $status_tests"
# Every test report: ctest's, or the pack's one per test binary.
xmls=()
for x in "$out/tests.xml" "$out/vmm-tests.xml"; do [ -f "$x" ] && xmls+=("$x"); done
if [ "${#xmls[@]}" -gt 0 ]; then
  echo "  $(cat "${xmls[@]}" | grep -c '<testcase') test(s)," \
       "$(cat "${xmls[@]}" | grep -c '<failure') failure(s)," \
       "$(cat "${xmls[@]}" | grep -c '<skipped') skipped"
  cat "${xmls[@]}" | grep -A2 '<failure' | head -40 || true
fi
echo "bench: $status_bench"
[ -f "$out/bench.txt" ] && grep -E "peak|best:|host memory|skipped" "$out/bench.txt"
echo "same node: $status_same"
[ -f "$out/same-node.txt" ] && grep -E "^same node" "$out/same-node.txt"
echo "agent run: $status_agent"
echo "python CUDA tensors: $status_python"
echo "vllm connector, CUDA caches: $status_vllm"
[ -f "$out/agent-run/agent-run.txt" ] && sed 's/^agent run: /  /' "$out/agent-run/agent-run.txt"
[ "$status_build" = ok ] && [ "$status_tests" = passed ] && [ "$status_bench" = ok ] &&
  { [ "$status_agent" = ok ] || [ "$status_agent" = skipped ]; } &&
  [ "${status_python%% *}" != FAILED ] && [ "${status_vllm%% *}" != FAILED ]
