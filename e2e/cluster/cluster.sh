#!/usr/bin/env bash
# A local one-node Kubernetes of real parts, for `make e2e` (root, Linux; see e2e/README.md).
#
#   e2e/cluster/cluster.sh start DIR    etcd, kube-apiserver, controller-manager, scheduler, kubelet on
#                               containerd/runc with a bridge CNI, kube-proxy (iptables), CoreDNS, the
#                               KubeRay operator and Kueue, and kwok when its part is built (simulated nodes
#                               labelled kwok.x-k8s.io/node=fake, nothing else); last line: KUBECONFIG=DIR/kubeconfig
#   e2e/cluster/cluster.sh stop DIR     stop all by PID file, put back what the start changed on the host
#   e2e/cluster/cluster.sh status DIR   each part, the containerd socket (DIR/containerd.sock), the node
#   e2e/cluster/cluster.sh leftovers DIR  remove what a cluster killed hard (or a reboot) left, naming it (start does this too)
#
# Parts come from e2e/build/parts.sh (built once, cached by version). DIR holds certificates, configs, logs
# (DIR/logs/PART.log) and PID files (DIR/run/PART.pid); every start begins a fresh cluster (new etcd,
# new kubelet root); containerd's image store is kept in the cache across starts.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; DIR=${2:-}
[ -n "$cmd" ] && [ -n "$DIR" ] || { echo "usage: $0 start|stop|status|leftovers DIR" >&2; exit 2; }
case $cmd in start|stop|status|leftovers) ;; *) echo "usage: $0 start|stop|status|leftovers DIR" >&2; exit 2 ;; esac
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd) && chmod 700 "$DIR" || { echo "cluster: cannot use $DIR as the cluster's folder" >&2; exit 2; }

CACHE=${GEMMA3_RAY_CACHE:-$HOME/.cache/gemma3-ray}
RUNDIR=/run/gemma3-ray-e2e                 # containerd's socket and state (unix socket paths stay short)
CTR_SOCK=$RUNDIR/containerd/containerd.sock
GATEWAY=10.244.0.1 POD_CIDR=10.244.0.0/24  # cni0; CoreDNS and the API server listen on the gateway address
SERVICE_CIDR=10.96.0.0/16 API_SERVICE_IP=10.96.0.1
PAUSE_IMAGE=docker.io/local/pause:3.10 CNI_NETWORK=gemma3-ray-e2e
CNI_BIN=/usr/lib/cni; [ -x "$CNI_BIN/bridge" ] || CNI_BIN=/opt/cni/bin
NODE_PORTS="10250 10248 10257 10259 10249 10256"
# start order; stop goes backwards (containerd is handled on its own)
# (kwok last: started only when its part is built, `e2e/build/parts.sh build kwok`; stopped first, always)
PARTS="etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns kuberay-operator kueue kwok"
T0=$SECONDS

. "$HERE/lib.sh"
. "$HERE/host.sh"
. "$HERE/pki.sh"
. "$HERE/config.sh"
. "$HERE/images.sh"
. "$HERE/operators.sh"

part_bin() { "$HERE/../build/parts.sh" path "$1"; }
KUBE_BIN=$(part_bin kube) COREDNS_BIN=$(part_bin coredns) KUBERAY_BIN=$(part_bin kuberay) KUEUE_BIN=$(part_bin kueue)
KWOK_BIN=$(part_bin kwok); KWOK=0; [ -f "$KWOK_BIN/.built" ] && KWOK=1
KUBECTL=${KUBECTL:-$(command -v kubectl || echo "$KUBE_BIN/kubectl")}

owner() { cat "$CACHE/cluster.owner" 2>/dev/null; }

# the host-wide things belong to this DIR unless another DIR's cluster is running
host_is_ours() {
  local o; o=$(owner)
  [ -z "$o" ] || [ "$o" = "$DIR" ] && return 0
  DIR=$o alive containerd || DIR=$o alive kube-apiserver || DIR=$o alive kubelet && return 1
  return 0
}

preflight() {
  local c p missing=""
  [ "$(uname -s)" = Linux ] || { echo "cluster: needs Linux (kubelet, containerd, iptables); this is $(uname -s)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "cluster: needs root (it runs the kubelet and containerd and changes iptables): run it as root" >&2; exit 1; }
  for c in containerd runc ctr etcd iptables ip6tables ip openssl python3 curl setsid ss sysctl tar; do
    command -v "$c" >/dev/null || missing="$missing $c"
  done
  [ -x "$KUBECTL" ] || missing="$missing kubectl"
  for c in bridge host-local portmap loopback; do [ -x "$CNI_BIN/$c" ] || missing="$missing cni-plugin-$c"; done
  python3 -c 'import yaml' 2>/dev/null || missing="$missing python3-yaml"
  [ -z "$missing" ] || { echo "cluster: missing on this host:$missing (Debian: apt-get install -y containerd runc containernetworking-plugins etcd-server iptables iproute2 python3-yaml curl)" >&2; exit 1; }
  for p in kube coredns kuberay kueue; do
    [ -f "$(part_bin "$p")/.built" ] || { echo "cluster: the $p part is not built: run e2e/build/parts.sh build $p (once per version; kube takes about an hour on 2 cores)" >&2; exit 1; }
  done
  host_is_ours || { echo "cluster: another local cluster is running from $(owner): stop it first (e2e/cluster/cluster.sh stop $(owner))" >&2; exit 1; }
  earlier_leftovers
  if ip link show cni0 >/dev/null 2>&1 && [ ! -f "$DIR/host/recorded" ]; then
    echo "cluster: a cni0 bridge exists that this script did not make (another Kubernetes on this host?): remove it or stop that cluster" >&2; exit 1
  fi
  NODE_IP=$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')
  [ -n "$NODE_IP" ] || NODE_IP=$(ip -4 -o addr show scope global | awk '$2 != "cni0" {sub(/\/.*/, "", $4); print $4; exit}')
  [ -n "$NODE_IP" ] || { echo "cluster: no IPv4 address for the node (the kubelet refuses a loopback node IP)" >&2; exit 1; }
}

ports_free() {
  local p
  for p in $NODE_PORTS; do
    port_free "$p" || { echo "cluster: port $p is taken (kubelet/controller-manager/scheduler/kube-proxy ports are fixed): free it first" >&2; exit 1; }
  done
  if ss -Htuln "sport = :53" | grep -qE "($GATEWAY|0\.0\.0\.0|\*):53 "; then
    echo "cluster: $GATEWAY:53 is taken: CoreDNS serves there" >&2; exit 1
  fi
}

# What a cluster of this script left when it was killed hard (SIGKILL) or the machine rebooted: its folder
# (named by the cache's owner file) with no part running, or, with the folder gone, the cni0 bridge on
# our gateway address with no kubelet on the host and /etc/kueue holding a certificate of our CA.
# Recognised, named in one sentence, removed.
earlier_leftovers() {
  local o found="" crt=$KUEUE_METRICS_CERTS/tls.crt
  o=$(owner)
  if [ -n "$o" ] && [ "$o" != "$DIR" ] && [ -f "$o/host/recorded" ]; then
    found=$(DIR=$o leftovers 1 | tr '\n' ';' | sed 's/;$//; s/;/, /g')
    echo "cluster: an earlier cluster from $o was killed or the machine rebooted; removing what it left: ${found:-its records}" >&2
    ( DIR=$o; stop_all >/dev/null 2>&1 ) || { echo "cluster: could not remove all of it: run e2e/cluster/cluster.sh stop $o" >&2; exit 1; }
    return 0
  fi
  [ -n "$o" ] && [ "$o" != "$DIR" ] && rm -f "$CACHE/cluster.owner"
  [ -f "$DIR/host/recorded" ] && return 0   # our own folder: start cleans it up ("an earlier start")
  pgrep -x kubelet >/dev/null 2>&1 && return 0
  if ip -4 -o addr show dev cni0 2>/dev/null | grep -qF " $GATEWAY/24 "; then
    found="the bridge cni0 ($GATEWAY/24)"
  fi
  if [ -f "$crt" ] && openssl x509 -noout -issuer -in "$crt" 2>/dev/null | grep -q 'CN *= *gemma3-ray-e2e-ca'; then
    found="${found:+$found, }$KUEUE_METRICS_CERTS (a certificate of this script's CA)"
  fi
  [ -n "$found" ] || return 0
  echo "cluster: an earlier cluster of this script left, after a hard kill or a reboot: $found; removing it" >&2
  case $found in *cni0*) remove_network ;; esac
  case $found in *"$KUEUE_METRICS_CERTS"*) rm -rf "$KUEUE_METRICS_CERTS"; rmdir /etc/kueue/metrics /etc/kueue 2>/dev/null ;; esac
  return 0
}

all_running() {
  local n; alive containerd || return 1
  for n in $PARTS; do { [ "$n" = kwok ] && [ "$KWOK" = 0 ]; } || alive "$n" || return 1; done
}

remove_containers() {  # every task and container of the kubelet's namespace, through containerd
  alive containerd || return 0
  local c="ctr -a $CTR_SOCK -n k8s.io" id
  for id in $(timeout 20 $c tasks ls -q 2>/dev/null); do timeout 20 $c tasks rm -f "$id" >/dev/null 2>&1; done
  for id in $(timeout 20 $c containers ls -q 2>/dev/null); do
    timeout 20 $c containers rm "$id" >/dev/null 2>&1
    rm -f /var/lib/cni/results/*-"$id"-*   # libcni's cache (bridge and loopback): no CNI DEL after a kill
  done
}

stop_all() {
  local n rev="" left ours=0
  # only a DIR that recorded the host (it started) and owns it puts the host back
  [ -f "$DIR/host/recorded" ] && host_is_ours && ours=1
  for n in $PARTS; do rev="$n $rev"; done
  for n in $rev; do
    case $n in kube-apiserver|etcd) continue ;; esac
    kill_part "$n" 30
  done
  remove_containers
  kill_part containerd 20
  [ $ours = 1 ] && kill_leftovers
  kill_part kube-apiserver 20
  kill_part etcd 20
  if [ $ours = 1 ]; then
    unmount_all; remove_network; clean_iptables; kill_leftovers; remove_cgroups
    restore_sysctls
    remove_dirs
  fi
  left=$(leftovers $ours)
  if [ -n "$left" ]; then
    echo "cluster: stop left behind (a second stop tries again):" >&2; echo "$left" | sed 's/^/  /' >&2; return 1
  fi
  if [ $ours = 1 ]; then rm -f "$DIR/containerd.sock" "$CACHE/cluster.owner"; rm -rf "$DIR/host"; fi
  return 0
}

START_OK=0
on_exit() {
  local rc=$?
  [ "$START_OK" = 1 ] && return
  trap '' INT TERM HUP   # the clean-up itself runs to its end
  echo "cluster: start did not finish; stopping what it started ..." >&2
  stop_all && echo "cluster: stopped; the host is as before the start" >&2
  exit "$((rc == 0 ? 1 : rc))"
}

start() {
  preflight
  if all_running; then log "already running"; echo "KUBECONFIG=$DIR/kubeconfig"; START_OK=1; return 0; fi
  trap on_exit EXIT
  trap 'echo "cluster: interrupted" >&2; exit 130' INT TERM HUP
  if ls "$DIR"/run/*.pid >/dev/null 2>&1 || [ -f "$DIR/host/recorded" ]; then
    log "cleaning up an earlier start from $DIR (killed or stopped halfway): $(leftovers 1 | tr '\n' ',' | sed 's/,$//')"
    stop_all >/dev/null 2>&1
  fi
  ports_free
  rm -rf "$DIR/run" "$DIR/logs" "$DIR/etcd" "$DIR/kubelet" "$DIR/kueue" "$DIR/coredns" "$DIR/kube-proxy"
  mkdir -p "$DIR/run" "$DIR/logs"
  record_host
  mkdir -p "$CACHE" "$RUNDIR"; echo "$DIR" > "$CACHE/cluster.owner"
  pki || fail pki "openssl could not make the certificates in $DIR/pki"

  log "network: ip_forward on, bridge cni0 $GATEWAY/24"
  sysctl -qw net.ipv4.ip_forward=1
  ip link add cni0 type bridge 2>/dev/null; ip addr replace "$GATEWAY/24" dev cni0 && ip link set cni0 up \
    || fail cni0 "could not create the bridge cni0 with $GATEWAY/24"

  log "containerd (image store $CACHE/containerd)"
  write_containerd_config; write_cni_config
  spawn containerd "$(command -v containerd)" --config "$DIR/containerd/config.toml"
  wait_for containerd "answering on $CTR_SOCK" 30 ctr -a "$CTR_SOCK" version
  ln -sfn "$CTR_SOCK" "$DIR/containerd.sock"
  remove_containers

  log "etcd + kube-apiserver $("$KUBE_BIN/kube-apiserver" --version 2>/dev/null | cut -d' ' -f2)"
  local ep pp; ep=$(free_port); pp=$(free_port)
  spawn etcd "$(command -v etcd)" --name e2e --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ep" --advertise-client-urls "http://127.0.0.1:$ep" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "e2e=http://127.0.0.1:$pp" --unsafe-no-fsync
  API_PORT=$(free_port); echo "$API_PORT" > "$DIR/run/kube-apiserver.port"
  local d="$DIR/pki"
  spawn kube-apiserver "$KUBE_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ep" \
    --bind-address="$GATEWAY" --advertise-address="$GATEWAY" --secure-port="$API_PORT" \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" --client-ca-file="$d/ca.crt" \
    --kubelet-client-certificate="$d/apiserver-kubelet-client.crt" --kubelet-client-key="$d/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=Hostname,InternalIP \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction,ExtendedResourceToleration --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --cert-dir="$DIR/apiserver-certs" --profiling=false
  kubeconfigs admin kube-controller-manager kube-scheduler kubelet kube-proxy coredns kuberay-operator kueue kwok

  log "images: pause (and busybox) into containerd"
  images || fail containerd "the pause image could not be built or imported"

  wait_for kube-apiserver "ready" 150 kc get --raw /readyz
  alive etcd || fail etcd "it exited"
  log "kube-apiserver ready on https://$GATEWAY:$API_PORT"
  KUEUE_WEBHOOK_PORT=$(free_port); KUEUE_HEALTH_PORT=$(free_port)
  echo "$KUEUE_WEBHOOK_PORT $KUEUE_HEALTH_PORT" > "$DIR/run/kueue.ports"
  apply_rbac || FAIL_LOG="$DIR/logs/apply-rbac.log" fail kube-apiserver "it did not accept the parts' RBAC"

  log "controller-manager, scheduler, kubelet (node ip $NODE_IP), kube-proxy, CoreDNS"
  local auth=(--authentication-kubeconfig --authorization-kubeconfig --kubeconfig)
  spawn kube-controller-manager "$KUBE_BIN/kube-controller-manager" "${auth[@]/%/=$d/kube-controller-manager.kubeconfig}" \
    --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
    --service-account-private-key-file="$d/sa.key" --root-ca-file="$d/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$d/ca.crt" --cluster-signing-key-file="$d/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allocate-node-cidrs=false '--controllers=*,bootstrapsigner,tokencleaner'
  spawn kube-scheduler "$KUBE_BIN/kube-scheduler" "${auth[@]/%/=$d/kube-scheduler.kubeconfig}" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false
  write_kubelet_config
  spawn kubelet "$KUBE_BIN/kubelet" --config="$DIR/kubelet/config.yaml" --kubeconfig="$d/kubelet.kubeconfig" \
    --root-dir="$DIR/kubelet/root" --cert-dir="$DIR/kubelet/pki" --hostname-override=localhost --node-ip="$NODE_IP"
  write_proxy_config
  spawn kube-proxy "$KUBE_BIN/kube-proxy" --config="$DIR/kube-proxy/config.yaml"
  DNS_READY_PORT=$(free_port); echo "$DNS_READY_PORT" > "$DIR/run/coredns.ready-port"
  write_corefile
  spawn coredns "$COREDNS_BIN/coredns" -conf "$DIR/coredns/Corefile"
  log "KubeRay and Kueue CRDs, then the operators"
  apply_crds || FAIL_LOG="$DIR/logs/apply-crds.log" fail kube-apiserver "it did not accept the KubeRay and Kueue CRDs"
  start_kuberay
  start_kueue
  [ "$KWOK" = 1 ] && start_kwok

  wait_for kubelet "Ready (node localhost)" 90 node_ready
  restore_sysctls net.ipv4.ip_forward   # the kubelet wrote its kernel values at start: put the host's back
  log "node Ready"
  wait_for coredns "ready (kubernetes plugin synced)" 60 ready_url "http://127.0.0.1:$DNS_READY_PORT/ready"
  wait_for kube-proxy "syncing rules" 60 ready_url "http://127.0.0.1:10256/healthz"
  wait_for kube-controller-manager "creating service accounts" 60 kc -n default get serviceaccount default
  alive kube-scheduler || fail kube-scheduler "it exited"
  wait_operators
  log "KubeRay operator and Kueue ready (webhooks on https://127.0.0.1:$KUEUE_WEBHOOK_PORT)"
  if [ "$KWOK" = 1 ]; then
    wait_for kwok "ready" 60 ready_url "http://127.0.0.1:$KWOK_PORT/healthz"
    log "kwok ready: it manages the nodes labelled $KWOK_SELECTOR (none yet), the node localhost stays the kubelet's"
  fi
  START_OK=1
  log "started in $((SECONDS - T0)) s; containerd socket: $DIR/containerd.sock"
  echo "KUBECONFIG=$DIR/kubeconfig"
}

node_ready() {
  [ "$(kc get node localhost -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

status() {
  local n rc=0 pid
  for n in containerd $PARTS; do
    if [ "$n" = kwok ] && [ "$KWOK" = 0 ]; then echo "kwok: part not built (e2e/build/parts.sh build kwok): not started"; continue; fi
    if alive "$n"; then pid=$(pid_of "$n"); echo "$n: running, pid $pid"; else echo "$n: not running"; rc=1; fi
  done
  if alive containerd; then echo "containerd socket: $DIR/containerd.sock -> $CTR_SOCK (namespace k8s.io)"; fi
  if alive kube-apiserver; then
    echo "kube-apiserver: https://$GATEWAY:$(cat "$DIR/run/kube-apiserver.port")"
    echo "node localhost: $(node_ready && echo Ready || echo 'not Ready')"
    echo "KUBECONFIG=$DIR/kubeconfig"
  fi
  return $rc
}

# one start/stop at a time on this host
mkdir -p "$CACHE"; exec 9>"$CACHE/cluster.lock"
if [ "$cmd" != status ] && ! flock -n 9; then echo "cluster: another e2e/cluster/cluster.sh start or stop is running on this host" >&2; exit 1; fi
case $cmd in
  start) start ;;
  stop) trap '' INT TERM HUP   # the clean-up runs to its end
    stop_all && log "stopped; the host is as before the start" ;;
  status) status ;;
  leftovers) trap '' INT TERM HUP
    host_is_ours || { echo "cluster: a local cluster is running from $(owner): nothing to remove" >&2; exit 1; }
    earlier_leftovers ;;
esac
