# Sourced by guest-node-a and guest-node-b. The guests and the host share /xchg (9p, no
# cache). node-a drives the run; node-b and the host each serve a queue of commands there,
# so every step (and its timeout) is written once, in node-a's script, in order.
RPC=/xchg/rpc
RESULTS=/xchg/results
OUT=/xchg/$ROLE
PKI=/xchg/pki
FERRYD=$FERRY_BUILD/server/ferryd
FERRYCTL=$FERRY_BUILD/client/ferryctl
export FERRY_SOCKET=/run/ferry/$ROLE.sock
mkdir -p "$RPC" /run/ferry
# Settings the host passes on (test-rdma).
[[ -f /xchg/env ]] && source /xchg/env

note() { echo "== $(date -u +%T) $*"; }

# result KEY VALUE...: one line of the summary's input.
result() { echo "$*" >>"$RESULTS"; }

# The agent's config: mTLS with the host-made CA, the peer on the other guest, a pool
# small enough for a 3 GiB guest. Extra YAML (a verbs section) may follow on stdin.
write_config() {
  local node=$1 addr=$2 peer=$3 peer_addr=$4
  cat <<YAML
node: $node
listen:
  local: /run/ferry/$node.sock
  peer: $addr:7100
peers:
  $peer: $peer_addr:7100
security:
  mode: mtls
  ca: $PKI/ca.pem
  cert: $PKI/$node.pem
  key: $PKI/$node.key
host_pool:
  size: 512MiB
YAML
  cat
}

# start_ferryd [PREFIX...]: starts this guest's agent (PREFIX: a command to run it under)
# and waits up to 60 s for its socket to answer. Its pid goes to /run/ferry/pid.
start_ferryd() {
  rm -f "$FERRY_SOCKET"
  "$@" "$FERRYD" --config /run/ferry/$ROLE.yaml >>"$OUT/ferryd.log" 2>&1 &
  echo $! >/run/ferry/pid
  local i
  for ((i = 0; i < 600; i++)); do
    if timeout 10 "$FERRYCTL" info >/dev/null 2>&1; then return 0; fi
    kill -0 "$(cat /run/ferry/pid)" 2>/dev/null || { note "ferryd exited at start"; return 1; }
    sleep 0.1
  done
  note "ferryd did not answer within 60 s"
  return 1
}

stop_ferryd() {
  local pid
  pid=$(cat /run/ferry/pid 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null
  timeout 40 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null
  rm -f /run/ferry/pid
}

# The IPv4-mapped RoCE v2 GID's index on rxe0 (what ferry picks by itself): rxe puts a
# link-local GID made from the MAC at index 0 even with IPv6 off, and that one does not
# route here (perftest on it: "Failed to modify QP to RTR").
roce_v2_ipv4_gid() {
  local port=/sys/class/infiniband/rxe0/ports/1 f i
  # One grep over the 1024 entries (a process per entry takes a minute under TCG).
  for f in $(grep -l '^0000:0000:0000:0000:0000:ffff:' "$port"/gids/* 2>/dev/null); do
    i=${f##*/}
    if [[ $(cat "$port/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]]; then
      echo "$i"
      return
    fi
  done
  echo 1
}

# serve NAME: runs the commands queued for NAME ($RPC/NAME.K.cmd, K = 1, 2, ...) in order,
# each under bash with its output in NAME.K.out and its status in NAME.K.rc, until one says
# `exit` or node-a's part has ended.
serve() {
  local name=$1 k=1
  while true; do
    if [[ -e $RPC/$name.$k.cmd ]]; then
      [[ "$(cat "$RPC/$name.$k.cmd")" == exit ]] && { echo 0 >"$RPC/$name.$k.rc"; return 0; }
      # The command may use this file's functions (start_ferryd, ...).
      bash -c 'source "$0"; source "$1"' "${BASH_SOURCE[0]}" "$RPC/$name.$k.cmd" \
        >"$RPC/$name.$k.out" 2>&1
      echo $? >"$RPC/$name.$k.rc.tmp"
      mv "$RPC/$name.$k.rc.tmp" "$RPC/$name.$k.rc"
      k=$((k + 1))
    elif [[ -e /xchg/node-a/exit ]]; then
      return 0 # node-a's part ended, however it ended
    else
      sleep 0.2
    fi
  done
}

# ask NAME TIMEOUT COMMAND: queues COMMAND for NAME (node-b or host), waits up to TIMEOUT
# seconds for its status, prints its output, returns its status (124: no answer in time).
# The sequence number lives in a file: ask often runs in a $(...) subshell.
ask() {
  local name=$1 t=$2 cmd=$3 k i
  k=$(($(cat "/run/ferry/asked.$name" 2>/dev/null || echo 0) + 1))
  echo "$k" >"/run/ferry/asked.$name"
  printf '%s\n' "$cmd" >"$RPC/$name.$k.tmp"
  mv "$RPC/$name.$k.tmp" "$RPC/$name.$k.cmd"
  for ((i = 0; i < t * 5; i++)); do
    if [[ -e $RPC/$name.$k.rc ]]; then
      cat "$RPC/$name.$k.out" 2>/dev/null
      return "$(cat "$RPC/$name.$k.rc")"
    fi
    sleep 0.2
  done
  note "ask $name: no answer within $t s to: $cmd"
  return 124
}
