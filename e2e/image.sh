#!/usr/bin/env bash
# The training image without a registry: a Debian base laid out like rayproject/ray, then the
# project's images/trainer/Dockerfile (unchanged) built on it with buildah, exported as a
# docker-archive and imported into a containerd. Everything is cached by content, outside the clone.
#   e2e/image.sh build               # base + trainer image into the cache (root; no cluster needed)
#   e2e/image.sh import SOCKET|DIR   # both into that containerd (namespace k8s.io); each skipped when it holds its id
#   e2e/image.sh name [base|trainer] # the reference for the e2e values (default trainer; imagePullPolicy Never)
#   e2e/image.sh path [base|trainer] # the image's docker-archive in the cache (built or not)
# base: Ray only, like rayproject/ray (the head, the submitter); trainer: the Dockerfile on it (workers).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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
MIRROR=${GEMMA3_RAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${GEMMA3_RAY_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# The trainer image's inputs: the Dockerfile and exactly the files it copies.
DOCKERFILE=images/trainer/Dockerfile
REQUIREMENTS=trainer/requirements.txt
CHECK_PINS=images/trainer/check_pins.py
# overlay works here as root (kernel overlayfs); vfs also works but copies every layer in full.
STORAGE_DRIVER=${GEMMA3_RAY_STORAGE_DRIVER:-overlay}

say() { printf '[image] %s\n' "$*" >&2; }
# Exit 3: the sentence is said; the exit trap adds nothing (also from a subshell of a step).
die() { printf 'e2e/image.sh: %s\n' "$*" >&2; exit 3; }

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
# ref IMAGE, archive IMAGE: for IMAGE base (Ray only: the head) or trainer (the workers).
ref() {
  case $1 in
    base) echo "docker.io/local/gemma3-ray-base:$(base_key)" ;;
    trainer) echo "docker.io/local/gemma3-ray-trainer:$(trainer_key)" ;;
    *) die "unknown image '$1' (base or trainer)" ;;
  esac
}
archive() { local r; r=$(ref "$1"); r=${r##*/}; echo "$CACHE/${r/:/-}.tar"; }

# chroot isolation for `run` too: its processes stay in the step's process group (runc's would not),
# and no runtime state is left behind when a step is stopped.
bah() {
  BUILDAH_ISOLATION=chroot buildah --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run" --storage-driver "$STORAGE_DRIVER" "$@"
}

# ---------------------------------------------------------------- clean-up on every exit path
CTR="" MNT="" TMP="" STEP="" CHILD="" LOCKED=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
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
  if ((rc == 130 || rc == 143)); then
    printf 'e2e/image.sh: interrupted%s; cleaned up, nothing of it was cached.\n' "${STEP:+ during $STEP}" >&2
  elif ((rc != 0 && rc != 3)) && [[ -n $STEP ]]; then
    printf 'e2e/image.sh: %s failed (exit %d); the output above says why; nothing of it was cached.\n' "$STEP" "$rc" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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
  flock -n 9 || { say "waiting for another e2e/image.sh on $CACHE"; flock 9; }
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
    return
  fi
  if ! bah inspect --type image "$ref" >/dev/null 2>&1; then
    say "base $ref: building (Debian $SUITE, Python $PYTHON, ray[$RAY_EXTRAS]==$RAY)"
    CTR=$(bah from --pull-never --name "gemma3-ray-base-$$" scratch)
    MNT=$(bah mount "$CTR")
    timed "base: Debian $SUITE rootfs (mmdebstrap)" base_rootfs
    timed "base: user ray, venv, ray[$RAY_EXTRAS]==$RAY (pip)" base_python
    timed "base: commit" bah commit --quiet --rm "$CTR" "$ref" >/dev/null
    CTR="" MNT=""
  fi
  say "base $ref: $(size_of "$ref") in buildah storage"
  export_archive "$ref" "$out"
}

build_trainer() {
  local ref out base; ref=$(ref trainer); out=$(archive trainer); base=$(ref base)
  if cached "$out"; then
    say "trainer $ref: cached ($out)"
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
}

# ---------------------------------------------------------------- containerd
containerd_socket() {
  local where=${1:-${GEMMA3_RAY_CONTAINERD:-}} s
  [[ -n $where ]] || die "import needs the cluster's containerd: e2e/image.sh import SOCKET|DIR (or GEMMA3_RAY_CONTAINERD)"
  for s in "$where" "$where/containerd.sock" "$where/containerd/containerd.sock"; do
    [[ -S $s ]] && { echo "$s"; return; }
  done
  die "no containerd socket at $where (nor $where/containerd.sock, $where/containerd/containerd.sock): start the cluster first (e2e/cluster.sh start DIR)"
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
  cached "$out" || die "the $2 image $ref is not built: run e2e/image.sh build first"
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
}

RAY=$(ray_pin)
case ${1:-} in
  build)
    need_build_tools; lock
    build_base
    build_trainer
    ;;
  import)
    command -v ctr >/dev/null || die "ctr is not installed: apt-get install -y containerd"
    import_images "${2:-}"
    ;;
  name) r=$(ref "${2:-trainer}") && echo "${r#docker.io/}" ;;
  path) archive "${2:-trainer}" ;;
  *) die "usage: e2e/image.sh build | import SOCKET|DIR | name [base|trainer] | path [base|trainer]" ;;
esac
