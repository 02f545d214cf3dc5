# shellcheck shell=bash
# Helpers of e2e/cluster/cluster.sh: progress lines, PID files, starting a part, waiting on it, failing with its log.
# Every part runs in its own session (setsid) and is known by DIR/run/NAME.pid: "PID BINARY". A PID
# counts as the part only while /proc/PID/exe is still that binary, so a reused PID is never signalled.

log() { printf '[cluster %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

pid_of() { [ -f "$DIR/run/$1.pid" ] && cut -d' ' -f1 "$DIR/run/$1.pid"; }

# alive NAME: the part's PID file names a live process that still runs the binary it was started as
alive() {
  local f="$DIR/run/$1.pid" pid bin exe
  [ -f "$f" ] || return 1
  read -r pid bin < "$f" || true
  [ -n "${pid:-}" ] && [ -d "/proc/$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "${exe% (deleted)}" = "$bin" ]
}

# spawn NAME BINARY ARGS...: start in its own session (a ^C at the terminal reaches only this script,
# whose trap stops the parts in order), output to DIR/logs/NAME.log
spawn() {
  local name=$1 bin; bin=$(readlink -f "$2"); shift 2
  : > "$DIR/logs/$name.log"
  setsid "$bin" "$@" >>"$DIR/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo "$! $bin" > "$DIR/run/$name.pid"
}

# kill_part NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS (default 20); removes the PID file
kill_part() {
  local name=$1 wait=${2:-20} pid i
  if alive "$name"; then
    pid=$(pid_of "$name")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait * 5; i++)); do alive "$name" || break; sleep 0.2; done
    if alive "$name"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.3; fi
  fi
  rm -f "$DIR/run/$name.pid"
}

# fail PART SENTENCE: one sentence naming the part, then the last lines of its log (FAIL_LOG, default
# DIR/logs/PART.log); the EXIT trap
# of `start` stops whatever was started
fail() {
  local part=$1 f; shift
  f=${FAIL_LOG:-$DIR/logs/$part.log}
  echo "cluster: $part failed to start: $*." >&2
  if [ -s "$f" ]; then
    echo "  last lines of $f:" >&2
    tail -n 12 "$f" | cut -c1-400 | sed 's/^/  | /' >&2
  fi
  exit 1
}

# wait_for PART WHAT SECONDS COMMAND...: until COMMAND succeeds; the part exiting or the time running
# out is a failure naming the part
wait_for() {
  local part=$1 what=$2 secs=$3 t; shift 3
  t=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive "$part" || fail "$part" "it exited before it was $what"
    [ "$SECONDS" -lt "$t" ] || fail "$part" "not $what after ${secs} s"
    sleep 0.5
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

port_free() {  # port_free PORT: nothing listens on it (any address)
  ! ss -Htln "sport = :$1" | grep -q .
}

kc() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }
