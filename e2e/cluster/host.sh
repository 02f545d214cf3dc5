# shellcheck shell=bash
# What the cluster changes outside DIR, recorded before the first part starts and put back by `stop`:
# sysctls (the kubelet writes its preferred kernel values; pods need ip_forward), folders it creates
# (/run/containerd, /var/lib/kubelet, ...), cgroups (kubepods, k8s.io), iptables: the KUBE-* chains and
# the CNI chains and rules of our network (other CNI users on the host, e.g. podman, keep theirs), the
# cni0 bridge, mounts under the kubelet root and containerd's state (pod network namespaces included).
# Only a DIR that recorded the host (DIR/host/recorded: it started) puts anything back.

SYSCTLS="net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet
net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.ipv6.conf.all.forwarding
net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
net.netfilter.nf_conntrack_tcp_timeout_close_wait"
HOST_DIRS="/run/containerd /var/lib/kubelet /var/lib/cni /var/log/containers /var/log/pods
/etc/kueue /usr/libexec/kubernetes /etc/kubernetes /var/lib/containerd /opt/containerd $RUNDIR"
CGROUPS="kubepods k8s.io"
TABLES="filter nat mangle raw"

# record_host: once per start; kept (not overwritten) until a stop has put everything back
record_host() {
  local k v d h c
  [ -f "$DIR/host/recorded" ] && return 0
  mkdir -p "$DIR/host"
  for k in $SYSCTLS; do v=$(sysctl -n "$k" 2>/dev/null) && printf '%s=%s\n' "$k" "$v"; done > "$DIR/host/sysctl"
  for d in $HOST_DIRS; do [ -e "$d" ] || echo "$d"; done > "$DIR/host/absent-dirs"
  # a copy that stop leaves in the logs, to audit what was put back
  mkdir -p "$DIR/logs"; cat "$DIR/host/sysctl" > "$DIR/logs/host-sysctl-before.txt"
  for h in /sys/fs/cgroup/*/; do
    for c in $CGROUPS; do [ -e "$h$c" ] || echo "$h$c"; done
  done > "$DIR/host/absent-cgroups"
  local ipt t
  # the KUBE-* and CNI-* chains already there (another Kubernetes, podman): stop leaves them alone
  for ipt in iptables ip6tables; do
    for t in $TABLES; do "$ipt-save" -t "$t" 2>/dev/null | grep -oE '^:(CNI|KUBE)-[^ ]+' | sed "s/^:/$ipt $t /"; done
  done > "$DIR/host/chains"
  touch "$DIR/host/recorded"
}

# restore_sysctls [KEY...]: write back every recorded value that changed, except the KEYs given
restore_sysctls() {
  local k v cur
  [ -f "$DIR/host/sysctl" ] || return 0
  while IFS='=' read -r k v; do
    case " $* " in *" $k "*) continue ;; esac
    cur=$(sysctl -n "$k" 2>/dev/null) || continue
    [ "$cur" = "$v" ] && continue
    if sysctl -qw "$k=$v" >/dev/null 2>&1; then echo "$k: $cur -> $v" >> "$DIR/logs/host-restored.txt"
    else echo "cluster: could not restore $k=$v (now $cur)" >&2; fi
  done < "$DIR/host/sysctl"
}

# the mount points the cluster leaves (pod volumes, the kubelet's bind mount of its root, container root
# filesystems, network namespaces), deepest first
our_mounts() {
  awk -v p="$DIR/ $RUNDIR/ /run/containerd/ /var/lib/kubelet/ $CACHE/containerd/" '
    BEGIN { n = split(p, pre, " ") }
    { for (i = 1; i <= n; i++) if (index($5, pre[i]) == 1) { print length($5), $5; next } }' /proc/self/mountinfo \
    | sort -rn | cut -d' ' -f2-
}

unmount_all() {
  local m i
  for i in 1 2 3; do
    m=$(our_mounts); [ -n "$m" ] || return 0
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done <<< "$m"
  done
}

# ours_chains IPT TABLE: the chains to remove: each KUBE-* chain that was not there at start (our kubelet
# and kube-proxy made it), and each CNI-* chain that was not there at start and holds no rule of another
# CNI network. (A folder recorded by an older script has only cni-chains: its KUBE-* chains are all its own.)
ours_chains() {
  local ipt=$1 t=$2 save c rec="$DIR/host/chains"
  [ -f "$rec" ] || rec="$DIR/host/cni-chains"
  save=$("$ipt-save" -t "$t" 2>/dev/null)
  for c in $(echo "$save" | grep -oE '^:(KUBE|CNI)-[^ ]+' | cut -c2-); do
    grep -qxF "$ipt $t $c" "$rec" 2>/dev/null && continue
    case $c in
      KUBE-*) echo "$c" ;;
      CNI-*)
        echo "$save" | grep -E "^-A $c " | grep -oE 'name: \\"[^\\]*\\"' | grep -vqF "\"$CNI_NETWORK\\" && continue
        echo "$c" ;;
    esac
  done
}

clean_iptables() {
  local ipt t line c chains
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in $TABLES; do
      chains=" $(ours_chains "$ipt" "$t" | tr '\n' ' ') "
      # rules of other chains (INPUT, POSTROUTING, a shared CNI-HOSTPORT-*) that jump to ours or belong to
      # our network, then our chains themselves
      "$ipt-save" -t "$t" 2>/dev/null | grep -E '^-A ' | while read -r line; do
        c=${line#-A }; c=${c%% *}
        case $chains in *" $c "*) continue ;; esac
        local target; target=$(echo "$line" | grep -oE -- '-[jg] [^ ]+' | cut -d' ' -f2)
        case $chains in *" $target "*) ;; *) echo "$line" | grep -qF "$CNI_NETWORK" || continue ;; esac
        eval "$ipt -w -t $t -D ${line#-A }" >/dev/null 2>&1 || true
      done
      for c in $chains; do "$ipt" -w -t "$t" -F "$c" >/dev/null 2>&1 || true; done
      for c in $chains; do "$ipt" -w -t "$t" -X "$c" >/dev/null 2>&1 || true; done
    done
  done
}

# processes the cluster left without a PID file: containerd shims of our socket, and whatever still
# runs in the pods' cgroups. Only these, by their ids.
kill_leftovers() {
  local p pids="" f
  for p in /proc/[0-9]*; do
    case "$(tr '\0' ' ' 2>/dev/null < "$p/cmdline")" in
      *containerd-shim*"-address $RUNDIR/containerd/containerd.sock"*) pids="$pids ${p#/proc/}" ;;
    esac
  done
  for f in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/pids/k8s.io /sys/fs/cgroup/unified/kubepods; do
    [ -d "$f" ] && pids="$pids $(find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
  done
  pids=$(echo $pids)
  [ -n "$pids" ] || return 0
  kill -KILL $pids 2>/dev/null || true
  sleep 0.5
}

remove_cgroups() {
  local cg i
  [ -f "$DIR/host/absent-cgroups" ] || return 0
  for i in 1 2 3 4 5; do
    local left=0
    while read -r cg; do
      [ -d "$cg" ] || continue
      find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
      [ -d "$cg" ] && left=1
    done < "$DIR/host/absent-cgroups"
    [ $left = 0 ] && return 0
    sleep 0.5
  done
}

remove_network() {
  local l
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-*   # libcni's cache of our pods' bridge network
  if ip link show cni0 >/dev/null 2>&1; then
    for l in $(ip -o link show master cni0 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link del "$l" 2>/dev/null || true
    done
    ip link del cni0 2>/dev/null || true
  fi
}

remove_dirs() {
  local d
  [ -f "$DIR/host/absent-dirs" ] || return 0
  while read -r d; do
    [ -n "$d" ] && [ -e "$d" ] || continue
    if our_mounts | awk -v d="$d/" 'index($0, d) == 1 {f = 1} END {exit !f}'; then echo "cluster: $d still has mounts; left in place" >&2; continue; fi
    rm -rf "$d"
  done < "$DIR/host/absent-dirs"
}

# leftovers [1]: one line per thing still there that a stop should have removed (empty when clean);
# the parts' processes, and with 1 (this DIR changed the host) everything else too
leftovers() {
  local n
  for n in $PARTS containerd; do alive "$n" && echo "process $n (pid $(pid_of "$n"))"; done
  [ "${1:-0}" = 1 ] || return 0
  for n in /proc/[0-9]*; do
    case "$(tr '\0' ' ' 2>/dev/null < "$n/cmdline")" in
      *containerd-shim*"-address $RUNDIR/containerd/containerd.sock"*) echo "containerd shim pid ${n#/proc/}" ;;
    esac
  done
  for n in iptables ip6tables; do
    for t in $TABLES; do
      ours_chains "$n" "$t" | sed "s/^/$n -t $t chain /"
      "$n-save" -t "$t" 2>/dev/null | grep -E '^-A ' | grep -cF "$CNI_NETWORK" | grep -v '^0$' | sed "s/^/$n -t $t rules of network $CNI_NETWORK: /"
    done
  done
  ip link show cni0 >/dev/null 2>&1 && echo "bridge cni0"
  our_mounts | sed 's/^/mount /'
  if [ -f "$DIR/host/absent-cgroups" ]; then
    while read -r n; do [ -e "$n" ] && echo "cgroup $n"; done < "$DIR/host/absent-cgroups"
  fi
  return 0
}
