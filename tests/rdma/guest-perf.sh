# Sourced by guest-node-a (run_perf): perftest's ib_write_bw, ib_read_bw and ib_write_lat
# between node-a and node-b beside ferry's 64 MiB WRITE and READ and 4 KiB WRITE latency,
# as ratios: TCG makes absolute numbers meaningless (NOTES: 0.05-0.3 Gb/s), but both run on
# the same emulated CPUs and the same rxe0s. ferry's bandwidth times are the agent's (ferryctl
# transfers: submit to settle), not ferryctl's start and file copies. Its 4 KiB latency is a
# client's, kept connected as ib_write_lat keeps its QP (tests/rdma/write_latency.cc: each
# Client::Write from call to answer, after a warm-up); ferryctl's 4 KiB put (a new session,
# a buffer and the peer's buffer looked up for every op) is printed beside it, as the cost
# of a one-shot tool, not of the data path.

PERF_BYTES=$((64 << 20))

# The last finished transfer's duration (us) and rails, from node-a's agent.
last_transfer() {
  "$FERRYCTL" transfers --recent 1 --json |
    jq -r '.recent[0] | "\(.duration_us // .durationUs) \((.rails // []) | join(","))"'
}

# perftest TOOL ARGS: runs TOOL's server on node-b and its client here; prints the client's
# result row (the line after the one starting "#bytes").
perftest() {
  local tool=$1
  shift
  ask $B 20 "$tool -d rxe0 -x \$(roce_v2_ipv4_gid) $* >/tmp/$tool.server.log 2>&1 &
    sleep 1" >/dev/null
  timeout 120 "$tool" -d rxe0 -x "$(roce_v2_ipv4_gid)" "$@" "$PEER_ADDR" >/tmp/"$tool".log 2>&1
  local rc=$?
  ask $B 30 "timeout 20 tail --pid=\$(pgrep -x $tool) -f /dev/null || pkill -x $tool" >/dev/null
  cat /tmp/"$tool".log
  ((rc == 0)) || { note "$tool failed ($rc)"; return 1; }
  awk '/^ *#bytes/ {getline; print; exit}' /tmp/"$tool".log >/tmp/"$tool".row
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
gbps() { awk -v bytes="$1" -v us="$2" 'BEGIN { if (us > 0) printf "%.3f", bytes * 8 / us / 1000 }'; }

run_perf() {
  note "perf: ferry 64 MiB WRITE and READ, 4 KiB WRITE x 7"
  head -c $PERF_BYTES /dev/urandom >/tmp/perf.src
  timeout 180 "$FERRYCTL" put /tmp/perf.src --to $B:buf || note "perf put failed"
  read -r w_us w_rails < <(last_transfer)
  timeout 180 "$FERRYCTL" get $B:buf /tmp/perf.back --length $PERF_BYTES || note "perf get failed"
  read -r r_us r_rails < <(last_transfer)
  cmp -s /tmp/perf.src /tmp/perf.back || note "perf: READ back differs from what was written"
  rm -f /tmp/perf.src /tmp/perf.back
  head -c 4096 /dev/urandom >/tmp/perf.4k
  local lat=() i us rails
  for i in $(seq 7); do
    timeout 60 "$FERRYCTL" put /tmp/perf.4k --to $B:buf >/dev/null || continue
    read -r us rails < <(last_transfer)
    lat+=("$us")
  done
  local put_us l_line l_us l_p90 l_rails
  put_us=$(printf '%s\n' "${lat[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  note "perf: 4 KiB WRITE x 200 from one client (rdma_write_latency)"
  l_line=$(timeout 300 "$FERRY_BUILD/tests/rdma_write_latency" --peer $B --buffer buf \
    --bytes 4096 --count 200 --warmup 20 2>&1 | tail -1)
  echo "$l_line"
  read -r _ l_rails < <(last_transfer)
  l_us=$(sed -n 's/.* median_us=\([^ ]*\).*/\1/p' <<<"$l_line")
  l_p90=$(sed -n 's/.* p90_us=\([^ ]*\).*/\1/p' <<<"$l_line")
  [[ -n "$l_us" ]] || note "rdma_write_latency: $l_line"

  note "perftest between the guests"
  local ib_w ib_r ib_lat
  perftest ib_write_bw -s 1048576 -n 64 -F --report_gbits && ib_w=$(awk '{print $4}' /tmp/ib_write_bw.row)
  perftest ib_read_bw -s 1048576 -n 64 -F --report_gbits && ib_r=$(awk '{print $4}' /tmp/ib_read_bw.row)
  # t_typical (the median), column 5.
  perftest ib_write_lat -s 4096 -n 200 -F && ib_lat=$(awk '{print $5}' /tmp/ib_write_lat.row)

  local f_w f_r
  f_w=$(gbps $PERF_BYTES "$w_us")
  f_r=$(gbps $PERF_BYTES "$r_us")
  result perf "WRITE 64 MiB: ferry ${f_w:--} Gb/s (rails $w_rails), ib_write_bw" \
    "${ib_w:--} Gb/s: ratio $(ratio "${f_w:-0}" "${ib_w:-0}")"
  result perf "READ  64 MiB: ferry ${f_r:--} Gb/s (rails $r_rails), ib_read_bw" \
    "${ib_r:--} Gb/s: ratio $(ratio "${f_r:-0}" "${ib_r:-0}")"
  # ib_write_lat's t_typical is half a ping-pong (one way); a ferry Write is answered once
  # the peer acknowledged it (a round trip) and crosses the client's socket twice.
  result perf "WRITE 4 KiB latency: ferry median ${l_us:--} us, p90 ${l_p90:--} us (one" \
    "client, 200 writes, rails ${l_rails:--}), ib_write_lat typical ${ib_lat:--} us (one way):" \
    "ferry/perftest $(ratio "${l_us:-0}" "${ib_lat:-0}")"
  result perf "WRITE 4 KiB by ferryctl put (new session each, agent's submit to settle):" \
    "median ${put_us:--} us of ${#lat[@]}"
}
