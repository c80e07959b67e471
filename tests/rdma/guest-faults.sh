# Sourced by guest-node-a (run_faults): faults from the real stack, each during or before a
# 64 MiB WRITE node-a -> node-b, each bounded by FAULT_TIMEOUT. Outcome per fault:
#   verified        the put succeeded and node-b holds the bytes (checksum);
#   error           the put failed with a named error (quoted);
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
  # Afterwards: does a fresh put get through (the rail back, or another one)?
  start_put
  FAULT_TIMEOUT=60 finish_after "$name"
}

# finish_after NAME: the put after a fault, one line.
finish_after() {
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
  sleep 1
  ask host 10 "monitor node-a 'set_link net0 off'"
  sleep 3
  ask host 10 "monitor node-a 'set_link net0 on'"
  finish_put cable_pull_3s
}

# node-b's agent SIGKILLed mid-put and started again (its buffer allocated again).
fault_peer_kill() {
  note "fault: peer ferryd SIGKILL + restart"
  start_put
  sleep 1
  ask $B 90 "kill -9 \$(cat /run/ferry/pid); sleep 1; start_ferryd && \$FERRYCTL alloc 64MiB --name buf"
  finish_put peer_sigkill
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
}

run_faults() {
  fault_cable_pull
  fault_peer_kill
  fault_memlock
}
