# shellcheck shell=bash
# The small images the cluster needs, built here (no registry) and imported into containerd's store,
# which lives in the cache: each is imported once per content and kept across stop/start.
#   local/pause:3.10   the pods' sandbox container (e2e/cluster/pause.c, gcc -static)
#   local/busybox:1.35 a shell for tests (Debian's busybox-static), built only where /bin/busybox is

# docker_archive REF ROOTFS OUT CMD_JSON: a one-layer docker-archive, byte-identical for the same input
docker_archive() {
  local ref=$1 rootfs=$2 out=$3 cmd=$4 t diff cfg arch
  case $(uname -m) in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
  t=$(mktemp -d)
  tar -C "$rootfs" --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -cf "$t/layer.tar" . || return 1
  diff=$(sha256sum "$t/layer.tar" | cut -d' ' -f1)
  printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$arch" "$cmd" "$diff" > "$t/config.json"
  cfg=$(sha256sum "$t/config.json" | cut -d' ' -f1); mv "$t/config.json" "$t/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$cfg" "$ref" > "$t/manifest.json"
  tar -C "$t" --sort=name --mtime=@0 --owner=0 --group=0 -cf "$out.tmp" manifest.json "$cfg.json" layer.tar \
    && mv "$out.tmp" "$out"
  local rc=$?; rm -rf "$t"; return $rc
}

build_pause() {  # -> path of the tar, cached by the source's hash
  local src="$HERE/pause.c" h out r
  h=$(sha256sum "$src" | cut -c1-16); out="$CACHE/cluster/images/pause-$h.tar"
  [ -f "$out" ] && { echo "$out"; return 0; }
  command -v gcc >/dev/null || { echo "gcc is needed once to build the pause image (apt-get install -y gcc libc6-dev)" >&2; return 1; }
  mkdir -p "$CACHE/cluster/images"; r=$(mktemp -d)
  gcc -Os -static -s -o "$r/pause" "$src" || { rm -rf "$r"; return 1; }
  docker_archive "local/pause:3.10" "$r" "$out" '["/pause"]'; local rc=$?; rm -rf "$r"
  [ $rc = 0 ] && echo "$out"
}

build_busybox() {
  local bb=/bin/busybox h out r a
  h=$(sha256sum "$bb" | cut -c1-16); out="$CACHE/cluster/images/busybox-$h.tar"
  [ -f "$out" ] && { echo "$out"; return 0; }
  mkdir -p "$CACHE/cluster/images"; r=$(mktemp -d)
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/root"; chmod 1777 "$r/tmp"
  cp "$bb" "$r/bin/busybox"
  for a in $("$bb" --list); do [ "$a" = busybox ] || ln -s busybox "$r/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$r/etc/group"
  docker_archive "local/busybox:1.35" "$r" "$out" '["/bin/sh"]'; local rc=$?; rm -rf "$r"
  [ $rc = 0 ] && echo "$out"
}

# import_image REF TAR: into containerd's k8s.io namespace unless that tar is already in
import_image() {
  local ref=$1 tar=$2 mark h
  mark="$CACHE/containerd/imported/$(echo "$ref" | tr '/:' '__')"; h=$(sha256sum "$tar" | cut -d' ' -f1)
  if [ "$(cat "$mark" 2>/dev/null)" = "$h" ] && ctr -a "$CTR_SOCK" -n k8s.io images ls -q | grep -qxF "$ref"; then
    return 0
  fi
  ctr -a "$CTR_SOCK" -n k8s.io images import "$tar" >/dev/null || return 1
  mkdir -p "$(dirname "$mark")"; echo "$h" > "$mark"
}

images() {
  local t
  t=$(build_pause) && import_image "$PAUSE_IMAGE" "$t" || return 1
  if [ -x /bin/busybox ]; then
    t=$(build_busybox) && import_image docker.io/local/busybox:1.35 "$t" || return 1
  fi
}
