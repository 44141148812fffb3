#!/usr/bin/env bash
# A SuperNode and its long-lived ClientApp as one pair: flower-supernode with --isolation process, and
# pflower-clientapp (client_app/warm.py) serving its messages in one process. The first of the two to exit ends the
# other, and this script exits non-zero, so a supervisor (systemd's Restart=always) starts the pair anew.
#
#   deploy/warm-supernode.sh [--runtime-port 9094] [--bin DIR] [--stop-seconds 10] -- FLOWER-SUPERNODE-ARGS...
#
# Why a pair: a SuperNode keeps a reply in memory until its ClientApp has pushed every object of it, and waits for
# them without a deadline (Flower 1.42). A ClientApp that dies mid-push (a crash, an OOM kill) would leave the
# SuperNode waiting for ever, training nothing, while it still counts as online; restarting both clears that
# reply, and the round that lost it gives it up at its round-timeout. The client state is written before the reply
# is pushed, so the restarted ClientApp goes on from it.
# A ClientApp the kernel killed for memory (the service's cgroup counts an OOM kill) is named as such, with the
# memory limit: the model does not fit this device (docs/deployment.md, "Device budgets").
# --bin: the folder of both commands (default: PATH). --stop-seconds: how long the other may take to stop after
# SIGTERM before it is killed (a process that ignores SIGTERM, e.g. hung in a push, must not keep the pair from
# restarting). Everything after -- goes to flower-supernode.
# WARM_SUPERNODE_MEMORY_CGROUP: the memory cgroup folder to read (default: this process's, cgroup v2 or v1).
set -uo pipefail
PORT=9094 BIN="" STOP_SECONDS=10
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime-port) PORT="${2:-}"; shift 2 ;;
    --bin) BIN="${2:-}/"; shift 2 ;;
    --stop-seconds) STOP_SECONDS="${2:-}"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    *) echo "warm-supernode: unknown option '$1' (flower-supernode's options go after --)" >&2; exit 2 ;;
  esac
done
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] \
  || { echo "warm-supernode: --runtime-port must be a port number, got '$PORT'" >&2; exit 2; }
[[ "$STOP_SECONDS" =~ ^[0-9]+$ ]] && [ "$STOP_SECONDS" -ge 1 ] \
  || { echo "warm-supernode: --stop-seconds must be a whole number of seconds >= 1, got '$STOP_SECONDS'" >&2; exit 2; }
memory_cgroup() {  # this process's memory cgroup folder (v2: the unified one; v1: the memory controller's)
  if [ -n "${WARM_SUPERNODE_MEMORY_CGROUP:-}" ]; then echo "$WARM_SUPERNODE_MEMORY_CGROUP"; return; fi
  local v1 v2
  v1=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3; exit}' /proc/self/cgroup 2>/dev/null)
  v2=$(awk -F: '$1 == "0" {print $3; exit}' /proc/self/cgroup 2>/dev/null)
  if [ -n "$v1" ]; then echo "/sys/fs/cgroup/memory$v1"; elif [ -n "$v2" ]; then echo "/sys/fs/cgroup$v2"; fi
}
oom_kills() {  # how many processes the kernel killed for memory in that cgroup (0 when unknown)
  local folder; folder=$(memory_cgroup)
  cat "$folder/memory.events" "$folder/memory.oom_control" 2>/dev/null | awk '$1 == "oom_kill" {n = $2} END {print n + 0}'
}
memory_limit_mb() {
  local folder limit; folder=$(memory_cgroup)
  limit=$(cat "$folder/memory.max" "$folder/memory.limit_in_bytes" 2>/dev/null | head -1)
  [[ "$limit" =~ ^[0-9]+$ ]] && [ "$limit" -lt $((1 << 50)) ] && echo "$((limit / 1048576)) MB" || echo "none set"
}
stop_both() {  # SIGTERM to both; whatever still runs after --stop-seconds gets SIGKILL
  local tenths=0 left
  kill "$supernode" "$clientapp" 2>/dev/null
  while [ -n "$(jobs -rp)" ] && [ "$tenths" -lt $((STOP_SECONDS * 10)) ]; do sleep 0.1; tenths=$((tenths + 1)); done
  left=$(jobs -rp)
  if [ -n "$left" ]; then
    local who="the SuperNode and the ClientApp"
    [ "$left" = "$supernode" ] && who="the SuperNode"
    [ "$left" = "$clientapp" ] && who="the ClientApp"
    echo "warm-supernode: $who did not stop within $STOP_SECONDS s of SIGTERM; killing it" >&2
    kill -KILL $left 2>/dev/null
  fi
  wait 2>/dev/null
}
trap 'stop_both; exit 143' TERM INT
killed_before=$(oom_kills)
"${BIN}flower-supernode" "$@" --isolation process --port "$PORT" &
supernode=$!
"${BIN}pflower-clientapp" --runtime-api-address "127.0.0.1:$PORT" --insecure --parent-pid "$supernode" &
clientapp=$!
wait -n  # the first of the two to exit (bash 4.3+)
status=$?
if [ "$(oom_kills)" -gt "$killed_before" ]; then
  echo "warm-supernode: the kernel killed a process of this service for lack of memory (its memory limit:" \
    "$(memory_limit_mb)); the app's model does not fit this device: see docs/deployment.md, 'Device budgets'" >&2
fi
echo "warm-supernode: $( kill -0 "$supernode" 2>/dev/null && echo "the ClientApp" || echo "the SuperNode" ) exited" \
  "(status $status); stopping the other, so that both start anew" >&2
stop_both
exit $(( status == 0 ? 1 : status ))
