#!/bin/bash
# Runs a program built against libferry with one real agent (this build's ferryd, alone, a
# small pool), named to it in $FERRY_SOCKET, which Client::Connect("") reads. The agent is
# stopped by pid when the program ends, however it ends.
#   sdk_with_agent.sh FERRYD PROGRAM [ARGS...]
set -euo pipefail
ferryd=$1
shift
# shellcheck source=tests/one_agent.sh
. "$(dirname "$0")/one_agent.sh"

start_agent "$ferryd" sdk-test
FERRY_SOCKET=$sock "$@" || { tail -20 "$tmp/ferryd.log"; fail "$1"; }
stop_agent
