#!/usr/bin/env bash
# A SuperNode and its long-lived ClientApp as one pair: flower-supernode with --isolation process, and
# pflower-clientapp (client_app/warm.py) serving its messages in one process. The first of the two to exit ends the
# other, and this script exits non-zero, so a supervisor (systemd's Restart=always) starts the pair anew.
#
#   deploy/warm-supernode.sh [--runtime-port 9094] [--bin DIR] -- FLOWER-SUPERNODE-ARGS...
#
# Why a pair: a SuperNode keeps a reply in memory until its ClientApp has pushed every object of it, and waits for
# them without a deadline (Flower 1.42). A ClientApp that dies mid-push (a crash, an OOM kill) would leave the
# SuperNode waiting for ever, training nothing, while it still counts as online; restarting both clears that
# reply, and the round that lost it gives it up at its round-timeout. The client state is written before the reply
# is pushed, so the restarted ClientApp goes on from it.
# --bin: the folder of both commands (default: PATH). Everything after -- goes to flower-supernode.
set -uo pipefail
PORT=9094 BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime-port) PORT="${2:-}"; shift 2 ;;
    --bin) BIN="${2:-}/"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    *) echo "warm-supernode: unknown option '$1' (flower-supernode's options go after --)" >&2; exit 2 ;;
  esac
done
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] \
  || { echo "warm-supernode: --runtime-port must be a port number, got '$PORT'" >&2; exit 2; }
stop_both() { kill "$supernode" "$clientapp" 2>/dev/null; wait 2>/dev/null; }
trap 'stop_both; exit 143' TERM INT
"${BIN}flower-supernode" "$@" --isolation process --port "$PORT" &
supernode=$!
"${BIN}pflower-clientapp" --runtime-api-address "127.0.0.1:$PORT" --insecure --parent-pid "$supernode" &
clientapp=$!
wait -n  # the first of the two to exit (bash 4.3+)
status=$?
echo "warm-supernode: $( kill -0 "$supernode" 2>/dev/null && echo "the ClientApp" || echo "the SuperNode" ) exited" \
  "(status $status); stopping the other, so that both start anew" >&2
stop_both
exit $(( status == 0 ? 1 : status ))
