# Sourced by guest-node-a (run_faults): faults from the real stack (a cable pulled, eth0
# down, the peer agent killed, a memlock limit, rxe0 deleted), each during or before a
# 64 MiB WRITE node-a -> node-b, each bounded by FAULT_TIMEOUT. Outcome per fault:
#   verified        the put succeeded and node-b holds the bytes (checksum);
#   error           the put failed with a named error (quoted);
#   hang-deadline   the put failed DEADLINE_EXCEEDED: nothing failed it before its deadline;
#   hang            ferryctl had not returned after FAULT_TIMEOUT s (then killed).
# Then what node-a's `ferryctl nics` says about the rail, and whether a fresh put works.

FAULT_TIMEOUT=${FAULT_TIMEOUT:-100}
FAULT_BYTES=$((64 << 20))

# start_put: a 64 MiB put in the background; its exit status lands in /tmp/fault.rc.
start_put() {
  rm -f /tmp/fault.rc /tmp/fault.out
  head -c $FAULT_BYTES /dev/urandom >/tmp/fault.src
  ("$FERRYCTL" put /tmp/fault.src --to $B:buf >/tmp/fault.out 2>&1
  echo $? >/tmp/fault.rc) &
  FAULT_PID=$!
  FAULT_START=$SECONDS
}

# Waits (20 s at most) until the put is on the wire: rxe0 has sent 4 MiB more than when
# called (ferryctl first copies the file and resolves the buffer), so a fault lands mid-put.
wait_for_traffic() {
  local base i
  base=$(rxe_counter sent_pkts)
  for ((i = 0; i < 100; i++)); do
    (($(rxe_counter sent_pkts) - base > 4096)) && return 0
    [[ -e /tmp/fault.rc ]] && break
    sleep 0.2
  done
  note "the put was not seen on rxe0 before the fault"
}

# finish_put NAME: waits for the put, then records the fault's outcome.
finish_put() {
  local name=$1 i outcome detail
  for ((i = 0; i < FAULT_TIMEOUT * 5; i++)); do
    [[ -e /tmp/fault.rc ]] && break
    sleep 0.2
  done
  local took=$((SECONDS - FAULT_START))
  if [[ ! -e /tmp/fault.rc ]]; then
    pkill -P "$FAULT_PID" 2>/dev/null
    kill "$FAULT_PID" 2>/dev/null
    outcome=hang detail="no answer after ${took} s"
  elif [[ $(cat /tmp/fault.rc) == 0 ]]; then
    local landed
    landed=$(ask $B 120 "\$FERRYCTL get node-b:buf /tmp/chk --length $FAULT_BYTES >/dev/null &&
      sha256sum /tmp/chk | cut -c1-16")
    if [[ "$landed" == "$(sum_of /tmp/fault.src)" ]]; then
      outcome=verified detail="in ${took} s, checksum $landed"
    else
      outcome=CORRUPT detail="put said ok in ${took} s but node-b holds $landed"
    fi
  elif grep -q DEADLINE_EXCEEDED /tmp/fault.out; then
    # Not a hang of ours, but not an error from the stack either: the agent waited out its
    # whole deadline.
    outcome=hang-deadline detail="after ${took} s: $(tr '\n' ' ' </tmp/fault.out | cut -c1-300)"
  else
    outcome=error detail="after ${took} s: $(tr '\n' ' ' </tmp/fault.out | cut -c1-300)"
  fi
  note "fault $name: $outcome $detail"
  cat /tmp/fault.out
  "$FERRYCTL" nics | tee "$OUT/nics-after-$name.txt"
  "$FERRYCTL" transfers --recent 1 --json >"$OUT/transfer-$name.json"
  local rails retries
  rails=$(jq -r '.recent[0] | (.rails // []) | join(",")' "$OUT/transfer-$name.json")
  retries=$(jq -r '.recent[0].retries // 0' "$OUT/transfer-$name.json")
  result fault "$name" "$outcome" "$detail; rails ${rails:--}, retried slices $retries"
}

# then_put NAME: after the fault (and any recovery), does a fresh put get through (the rail
# back, or another one)? One line.
then_put() {
  start_put
  local i
  for ((i = 0; i < FAULT_TIMEOUT * 5; i++)); do
    [[ -e /tmp/fault.rc ]] && break
    sleep 0.2
  done
  local rc=hang
  [[ -e /tmp/fault.rc ]] && rc=$(cat /tmp/fault.rc)
  [[ $rc == hang ]] && { pkill -P "$FAULT_PID"; kill "$FAULT_PID"; } 2>/dev/null
  local rails
  rails=$("$FERRYCTL" transfers --recent 1 --json | jq -r '.recent[0] | (.rails // []) | join(",")')
  result fault "$1" "then:" "a new 64 MiB put: $([[ $rc == 0 ]] && echo ok || echo "failed ($rc):" \
    "$(tr '\n' ' ' </tmp/fault.out | cut -c1-200)") in $((SECONDS - FAULT_START)) s, rails $rails"
}

# The cable pulled from node-a's NIC (QEMU set_link) for 3 s mid-put.
fault_cable_pull() {
  note "fault: cable pull 3 s"
  start_put
  wait_for_traffic
  ask host 10 "monitor node-a 'set_link net0 off'"
  sleep 3
  ask host 10 "monitor node-a 'set_link net0 on'"
  finish_put cable_pull_3s
  then_put cable_pull_3s
}

# node-b's agent SIGKILLed mid-put and started again (its buffer allocated again).
fault_peer_kill() {
  note "fault: peer ferryd SIGKILL + restart"
  start_put
  wait_for_traffic
  ask $B 90 "kill -9 \$(cat /run/ferry/pid); sleep 1; start_ferryd && \$FERRYCTL alloc 64MiB --name buf"
  finish_put peer_sigkill
  then_put peer_sigkill
}

# node-a's agent restarted without CAP_IPC_LOCK under a 1 MiB memlock limit (its pool and
# the 64 MiB put need more pinned), then restarted as before.
fault_memlock() {
  note "fault: memlock 1 MiB"
  stop_ferryd
  start_ferryd setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
    prlimit --memlock=1048576:1048576 -- || {
    result fault memlock_1MiB error "ferryd did not start: $(tail -n 3 "$OUT/ferryd.log" | tr '\n' ' ')"
    start_ferryd
    return
  }
  grep -i memlock "$OUT/ferryd.log" | tail -n 3
  start_put
  finish_put memlock_1MiB
  stop_ferryd
  start_ferryd
  then_put memlock_1MiB
}

# node-a's eth0 down for 3 s mid-put, from inside the guest: the kernel reports PORT_ERR,
# then PORT_ACTIVE, on rxe0.
fault_link_down() {
  note "fault: ip link set eth0 down 3 s"
  start_put
  wait_for_traffic
  ip link set eth0 down
  sleep 3
  ip link set eth0 up
  finish_put link_down_3s
  then_put link_down_3s
}

# rxe0 deleted mid-put while the agent has it open, then added again. The kernel's removal
# of rxe (no disassociate_ucontext) waits, in D state, until every context on it is closed,
# and tells nobody: the agent must notice the uverbs device gone and close rxe0 itself. The
# put goes on over tcp; after `rdma link add` the agent opens rxe0 again and uses it.
fault_device_delete() {
  note "fault: rdma link delete rxe0 mid-put"
  start_put
  wait_for_traffic
  local t0 pid i took
  t0=$(date +%s%N)
  rdma link delete rxe0 &
  pid=$!
  for ((i = 0; i < 300; i++)); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  took=$((($(date +%s%N) - t0) / 1000000))
  if kill -0 $pid 2>/dev/null; then
    local state
    state=$(awk '{print $3}' /proc/$pid/stat)
    "$FERRYCTL" nics >"$OUT/nics-after-device_delete.txt" 2>&1
    kill -9 "$(cat /run/ferry/pid)"
    rm -f /run/ferry/pid
    for ((i = 0; i < 50; i++)); do
      kill -0 $pid 2>/dev/null || break
      sleep 0.2
    done
    result fault rdma_link_delete hang "rdma link delete blocked ${took} ms" \
      "(state $state) while ferryd held rxe0; after SIGKILL of ferryd it" \
      "$(kill -0 $pid 2>/dev/null && echo "is still blocked" || echo "returned")"
    return
  fi
  result fault rdma_link_delete removal "returned in ${took} ms" \
    "($( ((took < 2000)) && echo "under 2 s" || echo "OVER 2 s"))"
  finish_put rdma_link_delete
  then_put rdma_link_delete_while_gone
  rdma link add rxe0 type rxe netdev eth0 || {
    result fault rdma_link_delete re-add "rdma link add failed"
    return
  }
  # The agent looks for it every 0.5 s and says when it is back (ferryd.log).
  for ((i = 0; i < 100; i++)); do
    grep -q 'rxe0 is back' "$OUT/ferryd.log" && break
    sleep 0.2
  done
  "$FERRYCTL" nics | tee "$OUT/nics-after-re-add.txt"
  grep -E 'rxe0 (is back|was removed)|closed \(' "$OUT/ferryd.log" | tail -n 4 |
    sed 's/^/fault rdma_link_delete log: /' >>"$RESULTS"
  local sent0
  sent0=$(rxe_counter sent_pkts)
  then_put rdma_link_delete_re-added
  result fault rdma_link_delete re-add "rxe0 sent $(($(rxe_counter sent_pkts) - sent0))" \
    "packets during the put after re-add"
}

run_faults() {
  fault_cable_pull
  fault_link_down
  fault_peer_kill
  fault_memlock
  fault_device_delete
}
