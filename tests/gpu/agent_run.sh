#!/usr/bin/env bash
# The agent-level GPU check of tests/gpu/run.sh: two ferryd on this machine, each with the
# CUDA backend on the same GPU, move cuda:0 buffers to each other through the staged path
# (GPU -> pinned bounce chunk -> tcp loopback -> bounce chunk -> GPU: the tcp provider cannot
# register GPU memory, so staging is the only way between them). gpu_staged_client maps both
# agents' buffers by CUDA IPC, fills the source, WRITEs node-a -> node-b and READs back, and
# checks each result by checksum through the receiving side's mapping. The staged rates are
# printed next to the cudaMemcpy D2H/H2D peaks that ferry-gpu-bench measured in the same run.
#
#   tests/gpu/agent_run.sh --bin DIR --out DIR [--peaks BENCH_TXT]
#     DIR holds ferryd, ferryctl and gpu_staged_client (build-gpu-pack); or name each one with
#     --ferryd FILE --ferryctl FILE --client FILE (a build folder)
#
# FERRY_GPU_BACKEND=sim runs the same with one simulated GPU per agent (shared memory that
# only the copy engine and the client's mapping touch; staged on purpose with gdr: never,
# since tcp reaches sim GPUs through the peer-memory stand-in): a dry run of this script's
# plumbing on a machine without a GPU.
# FERRY_AGENT_RUN_SIZE (default 512MiB, sim 64MiB; at most 1GiB: one op) and
# FERRY_AGENT_RUN_REPEAT (3) size it. Both agents are stopped on every way out (trap), and
# their configs and logs kept in --out.
# Exit status: 0 ok, 77 skipped (no GPU; the reason is printed), 1 failed.
set -uo pipefail

usage() {
  echo "usage: agent_run.sh (--bin DIR | --ferryd FILE --ferryctl FILE --client FILE)" \
       "--out DIR [--peaks BENCH_TXT]" >&2
  exit 2
}
ferryd="" ferryctl="" client="" out="" peaks=""
while [ $# -gt 1 ]; do
  case "$1" in
    --bin) ferryd=$2/ferryd ferryctl=$2/ferryctl client=$2/gpu_staged_client ;;
    --ferryd) ferryd=$2 ;;
    --ferryctl) ferryctl=$2 ;;
    --client) client=$2 ;;
    --out) out=$2 ;;
    --peaks) peaks=$2 ;;
    *) usage ;;
  esac
  shift 2
done
if [ $# -gt 0 ] || [ -z "$ferryd" ] || [ -z "$ferryctl" ] || [ -z "$client" ] || [ -z "$out" ]; then
  usage
fi
backend=${FERRY_GPU_BACKEND:-cuda}
size=${FERRY_AGENT_RUN_SIZE:-$([ "$backend" = sim ] && echo 64MiB || echo 512MiB)}
repeat=${FERRY_AGENT_RUN_REPEAT:-3}
mkdir -p "$out"
result=$out/agent-run.txt

# One line for run.sh's summary, also kept in agent-run.txt.
finish() {
  echo "agent run: $2" | tee "$result"
  exit "$1"
}

for b in "$ferryd" "$ferryctl" "$client"; do
  [ -x "$b" ] || finish 1 "FAILED ($b is missing)"
done
case "$backend" in
  cuda | sim) ;;
  *) finish 1 "FAILED (FERRY_GPU_BACKEND=$backend: not cuda or sim)" ;;
esac

# Where ferryd would find no GPU, say so before starting anything: the probe asks CUDA the
# same way the agent's gpu.backend: cuda does.
if [ "$backend" = cuda ]; then
  probe=$("$client" --probe 2>&1)
  rc=$?
  [ $rc -eq 77 ] && finish 77 "skipped ($probe)"
  [ $rc -eq 0 ] || finish 1 "FAILED (gpu_staged_client --probe: $probe)"
  echo "$probe"
fi

# Sizes in MiB for the config: node-a holds two buffers (source and READ destination).
size_mib=$(numfmt --from=iec-i --to-unit=Mi "${size%B}" 2>/dev/null) ||
  finish 1 "FAILED (FERRY_AGENT_RUN_SIZE=$size is not a size like 512MiB)"
pool_mib=$((2 * size_mib + 64))

dir=$(mktemp -d /tmp/ferry-agent-run-XXXXXX)
declare -A pid=()
started=()  # every agent pid, kept after stop_agents to check that none is left

stop_agents() {
  local node
  for node in "${!pid[@]}"; do kill -TERM "${pid[$node]}" 2>/dev/null; done
  for node in "${!pid[@]}"; do
    # A draining agent finishes within seconds; then it is killed.
    for _ in $(seq 100); do kill -0 "${pid[$node]}" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "${pid[$node]}" 2>/dev/null && echo "$node did not stop on SIGTERM: killed"
    wait "${pid[$node]}" 2>/dev/null
    unset "pid[$node]"
  done
  cp "$dir"/*.log "$dir"/*.yaml "$out/" 2>/dev/null
  rm -rf "$dir"
}
trap stop_agents EXIT
trap 'finish 130 "FAILED (interrupted)"' INT TERM

# A port on 127.0.0.1 below the ephemeral range that nothing listens on (a bind would tell for
# certain, bash cannot bind; a refused connect is close enough for a run on an idle machine).
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 10000))
    [ "$p" = "${1:-}" ] && continue
    (: < "/dev/tcp/127.0.0.1/$p") 2> /dev/null || { echo "$p"; return 0; }
  done
  return 1
}
port_a=$(free_port) || finish 1 "FAILED (no free port)"
port_b=$(free_port "$port_a") || finish 1 "FAILED (no free port)"

# gdr: with real GPUs `auto`: the planner itself must choose staging (this machine has no RDMA
# NIC, and tcp cannot reach GPU memory anyway); the client fails any leg that is not staged.
# Simulated GPU memory is host memory, which tcp could move directly: `never` keeps the dry
# run on the staged path too.
gdr=$([ "$backend" = cuda ] && echo auto || echo never)
write_config() { # node port other other_port
  cat > "$dir/$1.yaml" <<EOF
node: $1
listen:
  local: $dir/$1.sock
  peer: 127.0.0.1:$2
peers:
  $3: 127.0.0.1:$4
providers: [tcp]
host_pool:
  size: 64MiB
gpu:
  backend: $backend
$([ "$backend" = sim ] && echo "  count: 1")
  pool_size: ${pool_mib}MiB
policy:
  gdr: $gdr
  staging_chunk: 4MiB
  staging_depth: 4
log:
  level: info
EOF
}
write_config node-a "$port_a" node-b "$port_b"
write_config node-b "$port_b" node-a "$port_a"

echo "agents: node-a on 127.0.0.1:$port_a, node-b on 127.0.0.1:$port_b, gpu.backend $backend," \
     "pool ${pool_mib} MiB, in $dir"
for node in node-a node-b; do
  "$ferryd" --config "$dir/$node.yaml" > "$dir/$node.log" 2>&1 &
  pid[$node]=$!
  started+=("$!")
done
for node in node-a node-b; do
  ready=""
  for _ in $(seq 150); do
    if ! kill -0 "${pid[$node]}" 2>/dev/null; then
      wait "${pid[$node]}"
      status=$?
      tail -n 20 "$dir/$node.log"
      why=$(grep -m1 -iE 'error|fail' "$dir/$node.log" || tail -n1 "$dir/$node.log")
      finish 1 "FAILED ($node exited at start, status $status: ${why:-its log is empty})"
    fi
    "$ferryctl" --socket "$dir/$node.sock" info > "$dir/$node.info" 2>&1 && { ready=1; break; }
    sleep 0.2
  done
  [ -n "$ready" ] || finish 1 "FAILED ($node did not answer within 30 s)"
done
sed 's/^/  node-a: /' "$dir/node-a.info"

json=$out/agent-run.json
"$client" --a "$dir/node-a.sock" --b "$dir/node-b.sock" --device cuda:0 --size "$size" \
  --repeat "$repeat" --json "$json" | tee "$out/agent-run-client.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  tail -n 15 "$dir/node-a.log" "$dir/node-b.log"
  finish 1 "FAILED ($(grep -m1 FAILED "$out/agent-run-client.txt" || echo "client rc $rc"))"
fi

# The client's sessions ended with it: nothing of it may be left in either agent.
for node in node-a node-b; do
  left=$("$ferryctl" --socket "$dir/$node.sock" buffers | grep -c cuda:0)
  [ "$left" -eq 0 ] ||
    finish 1 "FAILED ($node still holds $left GPU buffer(s) after the client left)"
done

stop_agents
trap - EXIT
for p in "${started[@]}"; do
  kill -0 "$p" 2>/dev/null && finish 1 "FAILED (agent pid $p is still running)"
done
echo "both agents stopped"

# "WRITE node-a -> node-b: staged, median 5.10 GB/s, ..." -> "5.10"
rate() { grep -m1 "^$1 " "$out/agent-run-client.txt" | sed -E 's/.*median ([0-9.]+) GB\/s.*/\1/'; }
# "D2H  cudaMemcpy peak (one 1 GiB pinned buffer): 52.10 GB/s" -> "52.10" (sim: memcpy peak)
peak() {
  [ -f "$peaks" ] && grep -m1 -E "^$1 .* peak " "$peaks" | sed -E 's/.*: ([0-9.]+) GB\/s.*/\1/'
}
write=$(rate WRITE) read=$(rate READ) d2h=$(peak D2H) h2d=$(peak H2D)
# A staged transfer copies D2H on one side and H2D on the other, so the lower peak bounds it
# (as does the tcp loopback between the two, which is often the slower part).
if [ -n "$d2h" ] && [ -n "$h2d" ]; then
  kind=$([ "$backend" = cuda ] && echo cudaMemcpy || echo memcpy)
  vs=$(awk -v w="$write" -v r="$read" -v d="$d2h" -v h="$h2d" 'BEGIN {
    m = d < h ? d : h; printf "%.0f%% / %.0f%%", 100 * w / m, 100 * r / m }')
  peaks_text="against $kind peaks D2H $d2h GB/s, H2D $h2d GB/s ($vs of the lower)"
else
  peaks_text="no copy peaks to compare with (ferry-gpu-bench did not run or skipped)"
fi
finish 0 "ok ($backend, $size x$repeat each way, checksums verified): staged WRITE $write GB/s, \
READ $read GB/s (median), $peaks_text"
