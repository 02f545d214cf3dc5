#!/usr/bin/env bash
# A real OCI registry on this host (distribution's `registry`, built by e2e/build/parts.sh from its Go module),
# for `make e2e` on a cluster used only through KUBECONFIG: e2e/build/image.sh push puts the images there and
# the cluster's nodes pull them (plain HTTP on 127.0.0.1: nodes on this host; e2e/cluster/cluster.sh start with
# E2E_REGISTRY=HOST:PORT configures its containerd for it).
#
#   e2e/cluster/registry.sh start DIR    last line: E2E_REGISTRY=127.0.0.1:PORT (a free port; blobs kept in the cache)
#   e2e/cluster/registry.sh stop DIR     stops it by its PID file; the blobs stay for the next start
#   e2e/cluster/registry.sh status DIR
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; DIR=${2:-}
case $cmd in start|stop|status) ;; *) echo "usage: $0 start|stop|status DIR" >&2; exit 2 ;; esac
[ -n "$DIR" ] || { echo "usage: $0 start|stop|status DIR" >&2; exit 2; }
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd) || { echo "registry: cannot use $DIR" >&2; exit 2; }
CACHE=${GEMMA3_RAY_CACHE:-$HOME/.cache/gemma3-ray}
STORE=$CACHE/registry   # the registry's blobs: a pushed image is pushed once per content
BIN=$("$HERE/../build/parts.sh" path registry)/registry
T0=$SECONDS
log() { printf '[registry %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

# alive: the PID file names a live process still running the registry binary (a reused PID never is)
alive() {
  local pid exe
  [ -f "$DIR/registry.pid" ] || return 1
  pid=$(cat "$DIR/registry.pid")
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "${exe% (deleted)}" = "$(readlink -f "$BIN")" ]
}
addr() { cat "$DIR/registry.addr"; }

stop() {
  local pid i
  if alive; then
    pid=$(cat "$DIR/registry.pid"); kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do alive || break; sleep 0.2; done
    alive && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$DIR/registry.pid" "$DIR/registry.addr"
  log "stopped (blobs kept in $STORE)"
}

start() {
  [ -x "$BIN" ] || { echo "registry: the registry part is not built: run e2e/build/parts.sh build registry" >&2; exit 1; }
  if alive; then echo "E2E_REGISTRY=$(addr)"; return 0; fi
  trap 'stop; exit 130' INT TERM HUP
  local port; port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$STORE"
  cat > "$DIR/config.yml" <<CFG
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: "$STORE"}
  delete: {enabled: true}
http:
  addr: 127.0.0.1:$port
CFG
  setsid "$BIN" serve "$DIR/config.yml" >>"$DIR/registry.log" 2>&1 </dev/null &
  echo $! > "$DIR/registry.pid"; echo "127.0.0.1:$port" > "$DIR/registry.addr"
  local i
  for ((i = 0; i < 100; i++)); do
    curl -fs --max-time 2 -o /dev/null "http://127.0.0.1:$port/v2/" && break
    alive || { echo "registry: it exited at start; the last lines of $DIR/registry.log:" >&2; tail -n 8 "$DIR/registry.log" >&2; stop; exit 1; }
    sleep 0.2
  done
  curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$port/v2/" || { echo "registry: no answer on 127.0.0.1:$port/v2/ after 20 s" >&2; stop; exit 1; }
  trap - INT TERM HUP
  log "$("$BIN" --version 2>/dev/null | awk '{print $NF}') on http://127.0.0.1:$port (blobs in $STORE)"
  echo "E2E_REGISTRY=127.0.0.1:$port"
}

case $cmd in
  start) start ;;
  stop) trap '' INT TERM HUP; stop ;;
  status) if alive; then echo "registry: running, pid $(cat "$DIR/registry.pid"), http://$(addr)"; else echo "registry: not running"; exit 1; fi ;;
esac
