#!/usr/bin/env bash
# Smoke proof of a cluster started by e2e/cluster/cluster.sh: each check is a real behaviour that fails loudly.
#   e2e/cluster/smoke.sh DIR [RAY_IMAGE]
# node Ready; a pod runs and `kubectl logs` reads it; a Service answers by DNS name from a pod; a pod
# reaches the API server through the kubernetes Service; the KubeRay operator turns a RayCluster into
# pods; Kueue admits the Workload of a suspended RayJob through a ClusterQueue/LocalQueue and un-suspends
# it. RAY_IMAGE (default local/busybox:1.35, no Ray in it: the head pod is made but cannot start Ray)
# can be the trainer image e2e/build/image.sh imported: then the head must become Ready with Ray running.
set -uo pipefail
DIR=$(cd "${1:?usage: smoke.sh DIR [RAY_IMAGE]}" && pwd); RAY_IMAGE=${2:-local/busybox:1.35}
export KUBECONFIG=$DIR/kubeconfig
NS=e2e-smoke T0=$SECONDS
say() { printf '[smoke %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() {
  echo "smoke: FAILED: $*" >&2
  kubectl -n $NS get pods,services,rayclusters,rayjobs,workloads -o wide >&2 2>/dev/null
  cleanup; exit 1
}
cleanup() {
  kubectl delete namespace $NS --wait=false >/dev/null 2>&1
  kubectl delete clusterqueue e2e-smoke resourceflavor e2e-smoke --ignore-not-found --wait=false >/dev/null 2>&1
}
until_ok() {  # until_ok SECONDS WHAT COMMAND...
  local secs=$1 t=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $t ] || die "$what (waited $secs s)"; sleep 1; done
}
trap 'cleanup; exit 130' INT TERM

[ "$(kubectl get node localhost -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] || die "node localhost is not Ready"
say "node localhost Ready ($(kubectl get node localhost -o jsonpath='{.status.nodeInfo.kubeletVersion}'), $(kubectl get node localhost -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}'))"
kubectl delete namespace $NS --ignore-not-found --wait=true >/dev/null 2>&1
kubectl create namespace $NS >/dev/null || die "cannot create namespace $NS"
until_ok 60 "no default ServiceAccount in $NS" kubectl -n $NS get serviceaccount default

# 1. a pod runs; kubectl logs reads it (API server -> kubelet)
kubectl -n $NS run hello --image=local/busybox:1.35 --image-pull-policy=Never --restart=Never -- sh -c 'echo hello from $(hostname)' >/dev/null
until_ok 90 "pod hello did not succeed" sh -c "[ \"\$(kubectl -n $NS get pod hello -o jsonpath='{.status.phase}')\" = Succeeded ]"
[ "$(kubectl -n $NS logs hello)" = "hello from hello" ] || die "kubectl logs hello: '$(kubectl -n $NS logs hello 2>&1)'"
say "pod ran; kubectl logs: $(kubectl -n $NS logs hello)"

# 2. a Service by its DNS name from another pod (CoreDNS + kube-proxy), and the API server from a pod
kubectl -n $NS run web --image=local/busybox:1.35 --image-pull-policy=Never --labels=app=web --port=8080 \
  -- sh -c 'mkdir -p /www && echo served-by-web > /www/index.html && httpd -f -p 8080 -h /www' >/dev/null
kubectl -n $NS expose pod web --port=80 --target-port=8080 >/dev/null
until_ok 60 "pod web not Running" sh -c "[ \"\$(kubectl -n $NS get pod web -o jsonpath='{.status.phase}')\" = Running ]"
kubectl -n $NS run client --image=local/busybox:1.35 --image-pull-policy=Never --restart=Never -- sh -c '
  nslookup web.e2e-smoke.svc.cluster.local; printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 web 80 | tail -n 1
  printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 kubernetes.default.svc 443 | grep -q "HTTPS server" && echo api-reachable' >/dev/null
until_ok 60 "pod client did not finish" sh -c "kubectl -n $NS get pod client -o jsonpath='{.status.phase}' | grep -qE 'Succeeded|Failed'"
out=$(kubectl -n $NS logs client)
ip=$(kubectl -n $NS get service web -o jsonpath='{.spec.clusterIP}')
echo "$out" | grep -q "Address.*$ip" || die "web.e2e-smoke.svc.cluster.local did not resolve to $ip: $out"
echo "$out" | grep -q served-by-web || die "no answer from http://web: $out"
echo "$out" | grep -q api-reachable || die "the API server is not reachable from a pod at kubernetes.default.svc:443: $out"
say "DNS: web.$NS.svc.cluster.local -> $ip, HTTP through the ClusterIP answered; kubernetes.default.svc:443 reachable from a pod"

# 3. the KubeRay operator reconciles a RayCluster into a head pod and its Service
kubectl -n $NS apply -f - >/dev/null <<EOF || die "RayCluster refused"
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: smoke}
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    rayStartParams: {num-cpus: "0"}
    template:
      spec:
        containers:
        - name: ray-head
          image: $RAY_IMAGE
          imagePullPolicy: Never
          resources: {requests: {cpu: 100m, memory: 1Gi}, limits: {cpu: "1", memory: 2Gi}}
EOF
until_ok 60 "KubeRay made no head pod for RayCluster smoke" sh -c "kubectl -n $NS get pods -l ray.io/cluster=smoke,ray.io/node-type=head -o name | grep -q ."
until_ok 30 "KubeRay made no head Service for RayCluster smoke" sh -c "kubectl -n $NS get service -l ray.io/cluster=smoke -o name | grep -q ."
say "KubeRay: RayCluster smoke -> $(kubectl -n $NS get pods -l ray.io/cluster=smoke -o name) + $(kubectl -n $NS get service -l ray.io/cluster=smoke -o name)"
if [ "$RAY_IMAGE" != local/busybox:1.35 ]; then
  until_ok 240 "the Ray head of RayCluster smoke did not become Ready" kubectl -n $NS wait --for=condition=Ready pod -l ray.io/cluster=smoke,ray.io/node-type=head --timeout=5s
  until_ok 120 "RayCluster smoke did not reach state ready" sh -c "[ \"\$(kubectl -n $NS get raycluster smoke -o jsonpath='{.status.state}')\" = ready ]"
  say "Ray head Ready, RayCluster state ready"
  # a RayJob to SUCCEEDED: the operator on the host follows the job through the API server's service proxy
  kubectl -n $NS apply -f - >/dev/null <<EOF || die "RayJob hello refused"
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: hello}
spec:
  shutdownAfterJobFinishes: true
  submissionMode: K8sJobMode
  entrypoint: 'python -c "import ray; ray.init(); f = ray.remote(lambda x: x * 2); print(\"sum\", sum(ray.get([f.remote(i) for i in range(4)])))"'
  rayClusterSpec:
    rayVersion: "2.60.0"
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
          - {name: ray-head, image: $RAY_IMAGE, imagePullPolicy: Never, resources: {requests: {cpu: 500m, memory: 2Gi}, limits: {memory: 3Gi}}}
  submitterPodTemplate:
    spec:
      restartPolicy: Never
      containers:
      - {name: ray-job-submitter, image: $RAY_IMAGE, imagePullPolicy: Never, resources: {requests: {cpu: 200m, memory: 512Mi}}}
EOF
  until_ok 300 "RayJob hello did not succeed" \
    sh -c "[ \"\$(kubectl -n $NS get rayjob hello -o jsonpath='{.status.jobStatus}')\" = SUCCEEDED ]"
  kubectl -n $NS logs job/hello 2>/dev/null | grep -q "sum 12" || die "RayJob hello: its submitter's log has no 'sum 12'"
  say "RayJob hello SUCCEEDED (KubeRay followed it through the API server's service proxy); its log: sum 12"
fi
kubectl -n $NS delete raycluster smoke --wait=false >/dev/null

# 4. Kueue admits the Workload of a suspended RayJob and un-suspends it
kubectl apply -f - >/dev/null <<EOF || die "Kueue objects refused"
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: e2e-smoke}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: e2e-smoke}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: e2e-smoke
      resources:
      - {name: cpu, nominalQuota: "4"}
      - {name: memory, nominalQuota: 8Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: smoke, namespace: $NS}
spec: {clusterQueue: e2e-smoke}
---
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: queued
  namespace: $NS
  labels: {kueue.x-k8s.io/queue-name: smoke}
spec:
  suspend: true
  shutdownAfterJobFinishes: true
  entrypoint: python -c "print(1)"
  rayClusterSpec:
    rayVersion: "2.60.0"
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-head
            image: $RAY_IMAGE
            imagePullPolicy: Never
            resources: {requests: {cpu: 200m, memory: 512Mi}}
EOF
until_ok 60 "Kueue made no Workload for RayJob queued" sh -c "kubectl -n $NS get workloads -o name | grep -q ."
wl=$(kubectl -n $NS get workloads -o name | head -n 1)
until_ok 60 "Kueue did not admit $wl" \
  sh -c "[ \"\$(kubectl -n $NS get $wl -o jsonpath='{.status.conditions[?(@.type==\"Admitted\")].status}')\" = True ]"
# admitted means un-suspended: KubeRay then makes the job's RayCluster (it makes none while suspended)
until_ok 60 "KubeRay made no RayCluster for the admitted RayJob queued" sh -c "kubectl -n $NS get rayjob queued -o jsonpath='{.status.rayClusterName}' | grep -q ."
say "Kueue: $wl admitted by ClusterQueue e2e-smoke; RayJob un-suspended; KubeRay made RayCluster $(kubectl -n $NS get rayjob queued -o jsonpath='{.status.rayClusterName}')"
if [ "$RAY_IMAGE" != local/busybox:1.35 ]; then
  until_ok 300 "the admitted RayJob queued did not succeed" \
    sh -c "[ \"\$(kubectl -n $NS get rayjob queued -o jsonpath='{.status.jobStatus}')\" = SUCCEEDED ]"
  until_ok 60 "Kueue did not mark $wl Finished" \
    sh -c "[ \"\$(kubectl -n $NS get $wl -o jsonpath='{.status.conditions[?(@.type==\"Finished\")].status}')\" = True ]"
  say "the queued RayJob SUCCEEDED and its Workload is Finished"
fi

cleanup
say "all smoke checks passed"
