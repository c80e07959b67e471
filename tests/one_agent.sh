# shellcheck shell=bash
# Sourced by the tests that install ferry as a user would (sdk_install_test.sh,
# python_package_test.sh): a temporary folder, one real agent started and stopped by pid,
# and `fail`. The folder and the agent go when the script exits, however it exits.
tmp=$(mktemp -d "/tmp/ferry-${0##*/}.XXXXXX")
agent=
cleanup() {
  if [ -n "$agent" ]; then kill "$agent" 2>/dev/null || true; wait "$agent" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# start_agent FERRYD NODE: ferryd alone (no peers, a small pool) with its socket at $sock,
# waited for. Its peer port is a free one, named: a transfer to the agent's own node dials it.
start_agent() {
  sock=$tmp/ferryd.sock
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  "$1" --node "$2" --socket "$sock" --peer-listen "127.0.0.1:$port" --host-pool 64MiB \
    >"$tmp/ferryd.log" 2>&1 &
  agent=$!
  for _ in $(seq 100); do [ -S "$sock" ] && return; sleep 0.1; done
  cat "$tmp/ferryd.log"
  fail "ferryd did not start"
}

# stop_agent: SIGTERM (the agent drains), then its exit.
stop_agent() {
  kill "$agent"
  wait "$agent" || true
  agent=
}
