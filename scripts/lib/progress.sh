# Sourced by scripts/build-*.sh: progress lines for builds that are silent for minutes on a cold Go cache.
#
#   PROGRESS_TAG=build-k8s; . scripts/lib/progress.sh
#   log MESSAGE...            one "[TAG] MESSAGE" line on stderr
#   step LABEL CMD...         run CMD; every $BATCHFILL_BUILD_HEARTBEAT_S seconds (default 30) log LABEL and the
#                             elapsed time (and $BATCHFILL_BUILD_LOG, where the caller keeps the output)
#   stop_heartbeat            for an EXIT trap: end a heartbeat left running by a failed step
#
# The heartbeat sleeps in the background and waits for it, so a TERM ends it at once rather than after the
# sleep, and its stdout is /dev/null: a caller reading the script's stdout to EOF is not kept waiting by it.

log() { printf '[%s] %s\n' "${PROGRESS_TAG:-build}" "$*" >&2; }
LOG_HINT=${BATCHFILL_BUILD_LOG:+, log ${BATCHFILL_BUILD_LOG}}
HEARTBEAT=""

_heartbeat() {  # label t0
  local s=""
  trap '[ -z "$s" ] || kill "$s" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "${BATCHFILL_BUILD_HEARTBEAT_S:-30}" & s=$!
    wait "$s"
    log "$1: building, $(( $(date +%s) - $2 )) s elapsed$LOG_HINT"
  done
}

stop_heartbeat() {
  if [ -n "$HEARTBEAT" ]; then
    kill "$HEARTBEAT" 2>/dev/null || true
    wait "$HEARTBEAT" 2>/dev/null || true
    HEARTBEAT=""
  fi
}

step() {
  local label=$1 t0 rc=0
  shift
  t0=$(date +%s)
  log "$label: started$LOG_HINT"
  _heartbeat "$label" "$t0" >/dev/null &
  HEARTBEAT=$!
  "$@" || rc=$?
  stop_heartbeat
  if [ "$rc" = 0 ]; then log "$label: done in $(( $(date +%s) - t0 )) s"; fi
  return "$rc"
}
