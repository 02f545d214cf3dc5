#!/usr/bin/env bash
# Builds the real cluster's parts from their Go modules, pinned, into a cache outside the clone,
# keyed by version: a second run (and CI on the same machine) finds them and builds nothing.
#   e2e/build/parts.sh build [PART...]   # kube, coredns, kuberay, kueue, ct, registry (default: all of these);
#                                        # kwok only on demand: e2e/build/parts.sh build kwok
#   e2e/build/parts.sh path PART         # the folder holding PART's binaries (built or not)
#   e2e/build/parts.sh check             # exit 0 when every default part is built (kwok is not one)
#   e2e/build/parts.sh check-part PART   # exit 0 when PART is built (kwok included)
#   e2e/build/parts.sh go-check [PART]   # the installed Go is new enough for each part's go.mod (one sentence if not)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# One place for the versions (the issue pins KubeRay v1.5.0 and Kueue v0.17.0). Kubernetes stays on
# 1.32, the minor of ../shared/kube-apiserver, and on cgroup v1, which 1.35's kubelet refuses.
# v1.32.9: the newest 1.32 whose 31 staging modules the proxy serves at the same version (v1.32.13:
# k8s.io/endpointslice v0.32.13 refused; v1.32.11: k8s.io/kms v0.32.11; v1.32.12: kubectl, cli-runtime).
KUBE_VERSION=v1.32.9
COREDNS_VERSION=v1.12.4
# E2E_KUBERAY picks another KubeRay operator release (`E2E_KUBERAY=v1.6.1 make e2e`; .ci/run runs v1.7.0 when its
# part is cached, else v1.6.1, the newest the module proxy here serves whole); each version is its own part in the cache, built from the
# ray-operator module of that version. A version whose zip the proxy refuses (v1.7.0: 403 on 2026-12-02 and -03,
# its .mod served) is built from its git tag with E2E_KUBERAY_GIT=<a clone of github.com/ray-project/kuberay>:
# the tag's ray-operator folder becomes the module zip (e2e/build/module_zip.py) in a file:// proxy put before the
# machine's, and the go command checks that zip against the checksum database like any download.
KUBERAY_DEFAULT=v1.5.0
KUBERAY_VERSION=${E2E_KUBERAY:-$KUBERAY_DEFAULT}
KUEUE_VERSION=v0.17.0
CT_VERSION=v3.14.0
# The OCI registry (distribution's `registry`) the any-cluster proof pulls the images from (e2e/cluster/registry.sh).
REGISTRY_VERSION=v3.1.2
# kwok (sigs.k8s.io/kwok, a Kubernetes SIG project): only its controller, `kwok`, which the local cluster runs
# beside its real node when this part is cached, managing only the simulated nodes of the e2e `fleet` group
# (issue #43). Built on demand, not by `make e2e-parts` (the fleet group is opt-in; CI's warm-up stays as it
# was): e2e/build/parts.sh build kwok. v0.8.0: the newest the module proxy here serves (v0.6.1 .. v0.8.0).
KWOK_VERSION=v0.8.0

CACHE=${GEMMA3_RAY_CACHE:-$HOME/.cache/gemma3-ray}
# The machine's own go settings stay (GOPROXY, GOFLAGS from the environment or `go env -w`); -mod=mod is
# added to its GOFLAGS, not put in their place.
go_flags() { local f; f=$(go env GOFLAGS 2>/dev/null || true); echo "${f:+$f }-mod=mod"; }
PARTS=(kube coredns kuberay kueue ct registry)
OPTIONAL_PARTS=(kwok)  # built only when named

part_dir() {
  case $1 in
    kube) echo "$CACHE/parts/kube-$KUBE_VERSION" ;;
    coredns) echo "$CACHE/parts/coredns-$COREDNS_VERSION" ;;
    kuberay) echo "$CACHE/parts/kuberay-$KUBERAY_VERSION" ;;
    kueue) echo "$CACHE/parts/kueue-$KUEUE_VERSION" ;;
    ct) echo "$CACHE/parts/ct-$CT_VERSION" ;;
    registry) echo "$CACHE/parts/registry-$REGISTRY_VERSION" ;;
    kwok) echo "$CACHE/parts/kwok-$KWOK_VERSION" ;;
    *) echo "unknown part '$1' (one of: ${PARTS[*]} ${OPTIONAL_PARTS[*]})" >&2; return 2 ;;
  esac
}

module_of() {
  case $1 in
    kube) echo "k8s.io/kubernetes@$KUBE_VERSION" ;;
    coredns) echo "github.com/coredns/coredns@$COREDNS_VERSION" ;;
    kuberay) echo "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION" ;;
    kueue) echo "sigs.k8s.io/kueue@$KUEUE_VERSION" ;;
    ct) echo "github.com/helm/chart-testing/v3@$CT_VERSION" ;;
    registry) echo "github.com/distribution/distribution/v3@$REGISTRY_VERSION" ;;
    kwok) echo "sigs.k8s.io/kwok@$KWOK_VERSION" ;;
  esac
}

# mod_file MODULE@VERSION: the path of its go.mod in the module cache, fetched by the go command from
# wherever this machine's go settings say (GOPROXY, GONOSUMDB, GOPRIVATE ...). Only the go.mod: `go list -m`
# (not `go mod download`, which fetches the whole zip a proxy may refuse while it serves the .mod).
mod_file() {
  local out
  out=$(cd / && go list -m -f '{{.GoMod}}' "$1" 2>&1) || { echo "$out" | tail -n 2 | tr '\n' ' '; return 1; }
  [ -n "$out" ] && [ -f "$out" ] || { echo "the go command gave no go.mod for $1"; return 1; }
  echo "$out"
}

# go_ok PART: the installed go is at least the version PART's go.mod asks for (one sentence if not)
go_ok() {
  local m need have
  command -v go >/dev/null || { echo "[parts] no go command on PATH: the parts are built from their Go modules; install Go (the kube part needs Go >= 1.23)" >&2; return 1; }
  m=$(mod_file "$(module_of "$1")") || { echo "[parts] $1: the go command could not fetch $(module_of "$1") (GOPROXY=$(go env GOPROXY)): $m" >&2; return 1; }
  need=$(awk '$1 == "go" {print $2; exit}' "$m")
  have=$(go env GOVERSION); have=${have#go}
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    echo "[parts] $1: $(module_of "$1") needs Go >= $need (its go.mod) and this machine has go $have: install a newer Go (or let the go command fetch one: GOTOOLCHAIN=auto)" >&2
    return 1
  fi
}

# wrapper DIR MODULE@VERSION: a module that requires MODULE at VERSION, with MODULE's own replace
# directives copied (a dependency's replaces are ignored by Go, so the wrapper must restate them).
wrapper() {
  local dir=$1 mod=${2%@*} ver=${2#*@} m
  rm -rf "$dir/src"; mkdir -p "$dir/src"; cd "$dir/src"
  go mod init "gemma3-ray.local/parts" >/dev/null 2>&1
  m=$(mod_file "$mod@$ver") && cp "$m" upstream.mod
  # copy replace lines that point at module versions (not at local folders)
  awk '/^replace \(/{b=1;next} b&&/^\)/{b=0;next} b{print "replace " $0} /^replace [^(]/{print}' upstream.mod \
    | grep -v '=> \./' | grep -v '=> \.\./' >> go.mod || true
}

build_kube() {
  local out; out=$(part_dir kube); wrapper "$out" "k8s.io/kubernetes@$KUBE_VERSION"
  local minor=${KUBE_VERSION#v1.}
  # k8s.io/kubernetes requires its staging modules as v0.0.0 and replaces them with ./staging:
  # replace each with its published release of the same version.
  grep -oE 'k8s.io/[a-z0-9-]+ => \./staging' upstream.mod | awk '{print $1}' | while read -r m; do
    case $m in k8s.io/sample-*|k8s.io/code-generator) continue ;; esac
    echo "replace $m => $m v0.$minor" >> go.mod
  done
  go get "k8s.io/kubernetes@$KUBE_VERSION"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
  go build -trimpath -ldflags "$ld" -o "$out/bin.tmp/" k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-apiserver
}

build_coredns() {
  local out; out=$(part_dir coredns); wrapper "$out" "github.com/coredns/coredns@$COREDNS_VERSION"
  go get "github.com/coredns/coredns@$COREDNS_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/coredns" github.com/coredns/coredns
}

# kuberay_from_git OUT: the module zip of ray-operator at tag ray-operator/$KUBERAY_VERSION of $E2E_KUBERAY_GIT,
# served to this build from a file:// proxy before the machine's own (GOPROXY exported in the build's subshell)
kuberay_from_git() {
  local git=$E2E_KUBERAY_GIT tag="ray-operator/$KUBERAY_VERSION" fp="$1/git-proxy" commit
  commit=$(git -C "$git" rev-parse -q --verify "$tag^{commit}") || {
    echo "E2E_KUBERAY_GIT=$git has no tag $tag: give a clone of github.com/ray-project/kuberay that has it (git fetch --tags)"; return 1; }
  [ "$(go env GOSUMDB)" != off ] || {
    echo "GOSUMDB=off: a module zip made from git could not be checked against the checksum database; refusing"; return 1; }
  rm -rf "$fp"; mkdir -p "$fp/src"
  git -C "$git" archive "$tag" ray-operator | tar -x -C "$fp/src"
  # the go command adds the repository root's LICENSE to a module below the root that has none
  [ -f "$fp/src/ray-operator/LICENSE" ] || git -C "$git" show "$tag:LICENSE" > "$fp/src/ray-operator/LICENSE"
  python3 "$HERE/module_zip.py" "$fp/src/ray-operator" github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" "$fp/proxy"
  rm -rf "$fp/src"
  # the checksum database is asked for this module even where the machine exempts some (GONOSUMDB/GOPRIVATE)
  GOPROXY="file://$fp/proxy,$(go env GOPROXY)" GONOSUMDB="" GONOSUMCHECK="" GOPRIVATE="" GOINSECURE=""
  export GOPROXY GONOSUMDB GONOSUMCHECK GOPRIVATE GOINSECURE
  echo "ray-operator $KUBERAY_VERSION from $git tag $tag (commit $commit)" > "$1/source.txt"
}

build_kuberay() {
  local out; out=$(part_dir kuberay)
  if [ -n "${E2E_KUBERAY_GIT:-}" ]; then kuberay_from_git "$out"; fi
  wrapper "$out" "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION"
  go get "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION"
  if [ -n "${E2E_KUBERAY_GIT:-}" ]; then  # what the go command verified the zip against
    (go mod download -json "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION" \
      | python3 -c 'import json, sys; print("module zip checked by the go command against GOSUMDB:", json.load(sys.stdin)["Sum"])') >> "$out/source.txt"
    mkdir -p "$out/bin.tmp"; cp "$out/source.txt" "$out/bin.tmp/SOURCE"
  fi
  go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/ray-operator" github.com/ray-project/kuberay/ray-operator
  # its CRDs, from the same module version
  local src; src=$(go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)
  mkdir -p "$out/bin.tmp/crds"; cp "$src"/config/crd/bases/*.yaml "$out/bin.tmp/crds/"
  # its ClusterRole, which e2e/cluster/cluster.sh binds to the operator's own user (out-of-cluster run)
  mkdir -p "$out/bin.tmp/rbac"; cp "$src"/config/rbac/role.yaml "$out/bin.tmp/rbac/"
}

build_kueue() {
  local out; out=$(part_dir kueue); wrapper "$out" "sigs.k8s.io/kueue@$KUEUE_VERSION"
  go get "sigs.k8s.io/kueue@$KUEUE_VERSION"
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    -o "$out/bin.tmp/kueue" sigs.k8s.io/kueue/cmd/kueue
  local src; src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  mkdir -p "$out/bin.tmp/crds"; cp "$src"/config/components/crd/bases/*.yaml "$out/bin.tmp/crds/"
  # what e2e/cluster/cluster.sh needs to serve Kueue from the host: its ClusterRole, its webhook
  # configurations and the CRDs its kustomization gives a conversion webhook (patches enabled there)
  mkdir -p "$out/bin.tmp/rbac" "$out/bin.tmp/webhook" "$out/bin.tmp/crd-conversion"
  cp "$src"/config/components/rbac/role.yaml "$out/bin.tmp/rbac/"
  cp "$src"/config/components/webhook/manifests.yaml "$out/bin.tmp/webhook/"
  local f
  for f in $(grep -oE '^- path: patches/webhook_in_[a-z]+\.yaml' "$src"/config/components/crd/kustomization.yaml | cut -d' ' -f3); do
    cp "$src/config/components/crd/$f" "$out/bin.tmp/crd-conversion/"
  done
}

build_ct() {
  local out; out=$(part_dir ct); wrapper "$out" "github.com/helm/chart-testing/v3@$CT_VERSION"
  go get "github.com/helm/chart-testing/v3@$CT_VERSION"
  go build -trimpath -ldflags "-s -w -X github.com/helm/chart-testing/v3/ct/cmd.Version=$CT_VERSION" \
    -o "$out/bin.tmp/ct" github.com/helm/chart-testing/v3/ct
  local src; src=$(go list -m -f '{{.Dir}}' github.com/helm/chart-testing/v3)
  cp "$src"/etc/chart_schema.yaml "$src"/etc/lintconf.yaml "$out/bin.tmp/" 2>/dev/null || true
}

build_registry() {
  local out; out=$(part_dir registry); wrapper "$out" "github.com/distribution/distribution/v3@$REGISTRY_VERSION"
  go get "github.com/distribution/distribution/v3@$REGISTRY_VERSION"
  go build -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" \
    -o "$out/bin.tmp/registry" github.com/distribution/distribution/v3/cmd/registry
}

# kwok's controller, its upstream ClusterRole (kustomize/rbac/role.yaml, which e2e/cluster/cluster.sh binds to
# kwok's own user) and the Stage objects kwokctl gives a cluster by default (node-fast, node-heartbeat-with-lease,
# pod-fast): without a Stage kwok refuses to start ("no stages found"), and the CRD route needs its CRDs served
build_kwok() {
  local out; out=$(part_dir kwok); wrapper "$out" "sigs.k8s.io/kwok@$KWOK_VERSION"
  go get "sigs.k8s.io/kwok@$KWOK_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/kwok" sigs.k8s.io/kwok/cmd/kwok
  local src; src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  mkdir -p "$out/bin.tmp/rbac" "$out/bin.tmp/stages"
  cp "$src"/kustomize/rbac/role.yaml "$out/bin.tmp/rbac/"
  cp "$src"/kustomize/stage/node/fast/node-initialize.yaml \
    "$src"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    "$src"/kustomize/stage/pod/fast/pod-ready.yaml "$src"/kustomize/stage/pod/fast/pod-complete.yaml \
    "$src"/kustomize/stage/pod/fast/pod-delete.yaml "$out/bin.tmp/stages/"
}

build() {
  local p out
  for p in "$@"; do
    out=$(part_dir "$p") || return 2
    if [ -f "$out/bin/.built" ]; then echo "[parts] $p: cached in $out/bin"; continue; fi
    go_ok "$p" || return 1
    echo "[parts] $p: building from its Go module (once per version; log $out/build.log)"
    mkdir -p "$out"; rm -rf "$out/bin.tmp"
    local t0=$SECONDS
    if ! ( "build_$p" ) >"$out/build.log" 2>&1; then
      echo "[parts] $p: build failed; the last lines of $out/build.log:" >&2
      tail -n 15 "$out/build.log" >&2; return 1
    fi
    rm -rf "$out/bin"; mv "$out/bin.tmp" "$out/bin"; date -u +%FT%TZ > "$out/bin/.built"
    echo "[parts] $p: built in $((SECONDS - t0)) s -> $out/bin"
    prune "$p"
  done
}

# prune PART: keep this version and the one built before it (the last two keys); older ones go
prune() {
  local keep d n=0 default=""; keep=$(part_dir "$1")
  # make e2e's own KubeRay (the default) stays beside the last two tried (E2E_KUBERAY)
  [ "$1" = kuberay ] && default=$(KUBERAY_VERSION=$KUBERAY_DEFAULT part_dir kuberay)
  for d in $(ls -1dt "$CACHE/parts/$1-"*/ 2>/dev/null); do
    d=${d%/}; [ "$d" = "$keep" ] || [ "$d" = "$default" ] && continue
    n=$((n + 1)); [ $n -le 1 ] && continue
    echo "[parts] $1: removing $d (older than the last two versions)"; rm -rf "$d"
  done
}

export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}
GOFLAGS=$(go_flags); export GOFLAGS
cmd=${1:-build}; shift || true
case $cmd in
  build) [ $# -gt 0 ] || set -- "${PARTS[@]}"; build "$@" ;;
  path) echo "$(part_dir "$1")/bin" ;;
  goflags) echo "$GOFLAGS" ;;   # what the builds run with: the machine's GOFLAGS plus -mod=mod
  go-check) for p in "${@:-${PARTS[@]}}"; do go_ok "$p" || exit 1; done; echo "[parts] $(go env GOVERSION) builds every part" ;;
  check-part) [ -f "$(part_dir "${1:?check-part PART}")/bin/.built" ] || { echo "$1 is not built (e2e/build/parts.sh build $1)"; exit 1; } ;;
  check) for p in "${PARTS[@]}"; do [ -f "$(part_dir "$p")/bin/.built" ] || { echo "$p is not built (e2e/build/parts.sh build $p)"; exit 1; }; done ;;
  *) echo "usage: $0 build [PART...] | path PART | check | check-part PART | go-check [PART...] | goflags (PART: ${PARTS[*]} ${OPTIONAL_PARTS[*]})" >&2; exit 2 ;;
esac
