# shellcheck shell=bash
# The parts' configuration files, written into DIR on every start (see ../../shared/kube-node/README.md
# for why each knob is set: no CAP_SYS_RESOURCE, cgroup v1 with the cgroupfs driver, no registry).

write_containerd_config() {
  mkdir -p "$DIR/containerd" "$CACHE/containerd/root" "$RUNDIR/containerd"
  cat > "$DIR/containerd/config.toml" <<EOF
version = 2
# the image store lives in the cache so that imported images survive stop/start (e2e/build/image.sh)
root = "$CACHE/containerd/root"
state = "$RUNDIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$RUNDIR/containerd/containerd.sock"
[ttrpc]
  address = "$RUNDIR/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  disable_apparmor = true
  # root here lacks CAP_SYS_RESOURCE: no process may lower its oom_score_adj (the pause container asks -998)
  restrict_oom_score_adj = true
  # pods' network namespaces under our state folder, not /run/netns (other CNI users, e.g. podman, use it)
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$DIR/cni/net.d"
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri".registry]
  # one folder per registry host (hosts.toml): the plain-HTTP registries of E2E_REGISTRY
  config_path = "$DIR/containerd/certs.d"
EOF
  write_registry_hosts
}

# E2E_REGISTRY=HOST:PORT[,HOST:PORT...]: registries the node pulls from over plain HTTP (e2e/cluster/registry.sh),
# as a cluster owner configures a local registry (containerd's hosts.toml, like kind's certs.d)
write_registry_hosts() {
  local r
  rm -rf "$DIR/containerd/certs.d"; mkdir -p "$DIR/containerd/certs.d"
  for r in ${E2E_REGISTRY:+${E2E_REGISTRY//,/ }}; do
    mkdir -p "$DIR/containerd/certs.d/$r"
    printf 'server = "http://%s"\n\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' "$r" "$r" \
      > "$DIR/containerd/certs.d/$r/hosts.toml"
  done
}

write_cni_config() {
  rm -rf "$DIR/cni"; mkdir -p "$DIR/cni/net.d" "$DIR/cni/ipam"
  cat > "$DIR/cni/net.d/10-bridge.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

write_kubelet_config() {
  mkdir -p "$DIR/kubelet/manifests" "$DIR/kubelet/pod-logs" "$DIR/kubelet/volume-plugins"
  cat > "$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# the node is named localhost and serves on 127.0.0.1: the API server reaches it by its Hostname address
address: 127.0.0.1
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$DIR/pki/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$RUNDIR/containerd/containerd.sock
podLogsDir: "$DIR/kubelet/pod-logs"
staticPodPath: "$DIR/kubelet/manifests"
volumePluginDir: "$DIR/kubelet/volume-plugins"
clusterDomain: cluster.local
clusterDNS: ["$GATEWAY"]
podCIDR: "$POD_CIDR"
# no registry to pull a collected image back from
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "200Mi", nodefs.available: "1%", imagefs.available: "1%"}
enforceNodeAllocatable: []
# true makes the kubelet refuse to start; its kernel values are written back after it started
protectKernelDefaults: false
makeIPTablesUtilChains: false
rotateCertificates: false
serverTLSBootstrap: false
EOF
}

write_proxy_config() {
  mkdir -p "$DIR/kube-proxy"
  cat > "$DIR/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$DIR/pki/kube-proxy.kubeconfig"}
clusterCIDR: 10.244.0.0/16
nodePortAddresses: [primary]   # NodePorts on the node IP only
hostnameOverride: localhost
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# zeros: leave the host's conntrack sysctls alone
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
# false: leave net.ipv4.conf.all.route_localnet alone
iptables: {localhostNodePorts: false}
EOF
}

# CoreDNS on the host, on the bridge address the kubelet gives pods as their nameserver
write_corefile() {
  mkdir -p "$DIR/coredns"
  cat > "$DIR/coredns/Corefile" <<EOF
.:53 {
    bind $GATEWAY
    errors
    ready 127.0.0.1:$DNS_READY_PORT
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $DIR/pki/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    forward . /etc/resolv.conf
    cache 30
    loadbalance
}
EOF
}

# Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, Kueue v0.17): served from the host, webhook on
# 127.0.0.1 with our certificate, no internal cert management, the two Ray integrations the chart uses
write_kueue_config() {
  mkdir -p "$DIR/kueue/certs"
  cp "$DIR/pki/kueue-webhook.crt" "$DIR/kueue/certs/tls.crt"
  cp "$DIR/pki/kueue-webhook.key" "$DIR/kueue/certs/tls.key"
  cat > "$DIR/kueue/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: "0"   # off; Kueue still reads a certificate from /etc/kueue/metrics/certs (see operators.sh)
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $DIR/kueue/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks:
  - ray.io/rayjob
  - ray.io/raycluster
featureGates:
  # its extra API server is not registered here (no APIService): do not serve it
  VisibilityOnDemand: false
EOF
}
