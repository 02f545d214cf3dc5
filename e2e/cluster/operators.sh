# shellcheck shell=bash
# The KubeRay operator and Kueue, each the real controller built from its module (e2e/build/parts.sh), run on
# the host out of cluster with its own kubeconfig and its upstream ClusterRole. KubeRay reaches each Ray
# dashboard through the API server's service proxy (--use-kubernetes-proxy): the host does not resolve
# cluster DNS names. Kueue serves its webhooks on 127.0.0.1, registered by URL with our CA.

KUEUE_METRICS_CERTS=/etc/kueue/metrics/certs   # fixed in Kueue v0.17's main.go when it does not manage certs

manifests() {  # manifests rbac|crds|webhooks (kwok's ClusterRole too when its part is built)
  python3 "$HERE/manifests.py" "$KUBERAY_BIN" "$KUEUE_BIN" "https://127.0.0.1:$KUEUE_WEBHOOK_PORT" \
    "$DIR/pki/ca.crt" "$1" "$([ "${KWOK:-0}" = 1 ] && echo "$KWOK_BIN")"
}

# RBAC of every host-run part (the node's parts start right after it)
apply_rbac() {
  manifests rbac > "$DIR/manifests-rbac.json" \
    && kc apply --server-side -f "$DIR/manifests-rbac.json" >"$DIR/logs/apply-rbac.log" 2>&1
}

# the KubeRay and Kueue CRDs, before either controller starts. `create`, not apply: etcd is new on every
# start, and server-side apply of these large schemas costs a minute on 2 busy cores
apply_crds() {
  manifests crds > "$DIR/manifests-crds.json" || return 1
  kc create -f "$DIR/manifests-crds.json" >"$DIR/logs/apply-crds.log" 2>&1 || return 1
  # kubectl wait errors out (not waits) on a CRD whose status has no conditions yet: ask again
  local i
  for i in $(seq 30); do
    kc wait --for condition=established --timeout=20s crd/rayclusters.ray.io crd/rayjobs.ray.io \
      crd/workloads.kueue.x-k8s.io crd/clusterqueues.kueue.x-k8s.io crd/localqueues.kueue.x-k8s.io \
      >>"$DIR/logs/apply-crds.log" 2>&1 && return 0
    sleep 1
  done
  return 1
}

start_kuberay() {
  KUBERAY_PROBE_PORT=$(free_port); echo "$KUBERAY_PROBE_PORT" > "$DIR/run/kuberay-operator.probe-port"
  KUBECONFIG="$DIR/pki/kuberay-operator.kubeconfig" spawn kuberay-operator "$KUBERAY_BIN/ray-operator" \
    --metrics-addr=0 --health-probe-bind-address="127.0.0.1:$KUBERAY_PROBE_PORT" \
    --enable-leader-election=false --use-kubernetes-proxy \
    --feature-gates=RayClusterStatusConditions=true --log-stdout-encoder=console
}

start_kueue() {
  if [ -e "$KUEUE_METRICS_CERTS" ] && ! cmp -s "$KUEUE_METRICS_CERTS/tls.crt" "$DIR/pki/kueue-webhook.crt"; then
    fail kueue "$KUEUE_METRICS_CERTS exists and is not this cluster's (another Kueue on this host?)"
  fi
  mkdir -p "$KUEUE_METRICS_CERTS"
  cp "$DIR/pki/kueue-webhook.crt" "$KUEUE_METRICS_CERTS/tls.crt"
  cp "$DIR/pki/kueue-webhook.key" "$KUEUE_METRICS_CERTS/tls.key"
  write_kueue_config
  KUBECONFIG="$DIR/pki/kueue.kubeconfig" spawn kueue "$KUEUE_BIN/kueue" --config="$DIR/kueue/config.yaml"
}

ready_url() { curl -fsS -o /dev/null --max-time 2 "$1"; }

# after Kueue answers: its webhooks (registering them earlier would refuse objects it does not serve yet)
wait_operators() {
  wait_for kuberay-operator "ready" 90 ready_url "http://127.0.0.1:$KUBERAY_PROBE_PORT/readyz"
  wait_for kueue "ready" 90 ready_url "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz"
  manifests webhooks > "$DIR/manifests-webhooks.json" \
    && kc apply --server-side --force-conflicts -f "$DIR/manifests-webhooks.json" >"$DIR/logs/apply-webhooks.log" 2>&1 \
    || FAIL_LOG="$DIR/logs/apply-webhooks.log" fail kueue "the API server refused its webhook configurations"
  # ready probes only say the webhook server listens; a ClusterQueue turning Active says the controllers
  # run (an informer that cannot list, e.g. for want of RBAC, keeps them all from starting)
  echo '{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "e2e-cluster-start-probe"}, "spec": {}}' \
    | kc create -f - >/dev/null 2>"$DIR/logs/kueue-probe.log" \
    || FAIL_LOG="$DIR/logs/kueue-probe.log" fail kueue "a ClusterQueue was refused (through its webhooks)"
  wait_for kueue "reconciling (ClusterQueue e2e-cluster-start-probe Active)" 90 cq_active e2e-cluster-start-probe
  kc delete clusterqueue e2e-cluster-start-probe --wait=false >/dev/null 2>&1
}

cq_active() {
  [ "$(kc get clusterqueue "$1" -o jsonpath='{.status.conditions[?(@.type=="Active")].status}')" = True ]
}

# kwok (sigs.k8s.io/kwok, e2e/build/parts.sh build kwok): the controller that keeps simulated nodes Ready and plays
# their pods' lifecycle, for the e2e `fleet` group's GKE-shaped GPU pools (e2e/support/fleet_nodes.py). It manages
# only the nodes labelled KWOK_SELECTOR (--manage-nodes-with-label-selector, kwok v0.8.0), never the kubelet's node
# localhost; its Stages are the defaults kwokctl gives a cluster (node-initialize, node-heartbeat-with-lease,
# pod-ready, pod-complete, pod-delete), copied from its module by parts.sh. HOME is DIR/kwok: kwok also reads
# ~/.kwok/kwok.yaml when it exists, and this host's is not ours. Its pods' IPs come from a range no real pod uses.
# KUBE_FEATURE_WatchListClient=false: kwok v0.8.0's client-go (v0.36) asks for watch streams, which this API server
# refuses ("the required storage feature RequestWatchProgress is disabled"); checked on ../shared/kube-apiserver:
# with it a pod bound to a kwok node was Running within 9 s, without it still Pending after 31 s. The parallelism
# options are those of kwok's own kustomize/kwok/kwok.yaml: left out, kwok exits ("playStageParallelism must be
# greater than 0").
KWOK_SELECTOR=kwok.x-k8s.io/node=fake
KWOK_POD_CIDR=10.246.0.0/16

start_kwok() {
  KWOK_PORT=$(free_port); echo "$KWOK_PORT" > "$DIR/run/kwok.port"
  rm -rf "$DIR/kwok"; mkdir -p "$DIR/kwok"
  { printf 'apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n'
    printf '  nodeLeaseParallelism: 4\n  podPlayStageParallelism: 4\n  nodePlayStageParallelism: 4\n'
    printf '  enablePodsOnNodeSyncStreamWatch: true\n'
    local f; for f in "$KWOK_BIN"/stages/*.yaml; do printf -- '---\n'; cat "$f"; done; } > "$DIR/kwok/kwok.yaml"
  HOME="$DIR/kwok" KUBE_FEATURE_WatchListClient=false spawn kwok "$KWOK_BIN/kwok" --kubeconfig="$DIR/pki/kwok.kubeconfig" --config="$DIR/kwok/kwok.yaml" \
    --manage-nodes-with-label-selector="$KWOK_SELECTOR" --server-address="127.0.0.1:$KWOK_PORT" \
    --cidr="$KWOK_POD_CIDR" --node-lease-duration-seconds=40
}
