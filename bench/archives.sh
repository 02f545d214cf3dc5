#!/usr/bin/env bash
# bench/archives.sh [site|assets|unsloth|all] — builds, here (a CPU machine with pip's index), every archive a GPU
# call of the bench carries (issue #45 item 4): nothing can be downloaded on the GPU machine.
#
#   .whl/site.tar.xz            Ray, TRL, datasets, Liger for the device's CPython 3.12 (../shared/device/make-bundle.sh)
#   .bench/assets.tar.xz        the processor and the 4B config (python3 -m bench.bench prepare; the GGUF package is here)
#   .bench/unsloth-site.tar.xz  Unsloth 2026.10.9 and what it imports that the device image lacks (pins below)
#
# FlashAttention 4's site (flash-attn-4 with nvidia-cutlass-dsl's cu13 libraries) packs to 64.0 MiB, over one
# call's limit with anything beside it; it is not in the training image (images/trainer), so the headline is the
# stock row and this script does not build it (bench/README.md, "FlashAttention 4").
# Each archive is rebuilt only when missing (remove it to rebuild). Wheels come from pip's own configured index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
what=${1:-all}

# The pins that ran on the device (bench/RESULTS.md, round 5): Unsloth's own TRL beside the bundle's.
UNSLOTH_PINS=(unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 tyro==1.0.16 docstring-parser==0.18.0
  typeguard==4.6.0 torchao==0.18.0 cut-cross-entropy==25.1.1 msgspec==0.22.0)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)

site() {
  [ -s .whl/site.tar.xz ] && { echo "[archives] .whl/site.tar.xz: there"; return; }
  local bundle=../shared/device/make-bundle.sh
  [ -x "$bundle" ] || { echo "[archives] $bundle is missing: the bundle's script sits in ../shared/device beside a checkout"; exit 1; }
  "$bundle" .whl
}

assets() {
  [ -s .bench/assets.tar.xz ] && { echo "[archives] .bench/assets.tar.xz: there"; return; }
  mkdir -p .bench
  "$PY" -m bench.bench prepare --out .bench/assets
  tar cJf .bench/assets.tar.xz.tmp -C .bench assets && mv .bench/assets.tar.xz.tmp .bench/assets.tar.xz
}

unsloth() {
  [ -s .bench/unsloth-site.tar.xz ] && { echo "[archives] .bench/unsloth-site.tar.xz: there"; return; }
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$work/wheels" "${UNSLOTH_PINS[@]}"
  mkdir -p "$work/site"
  for w in "$work"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$work/site"; done
  # Unsloth's wheel carries Unsloth Studio (82 MiB of a web app and docs) that `import unsloth` never reads; without
  # it the archive fits one call beside the bundle
  rm -rf "$work/site/studio"
  mkdir -p .bench
  XZ_OPT=${XZ_OPT:--2 -T0} tar cJf .bench/unsloth-site.tar.xz.tmp -C "$work/site" . && mv .bench/unsloth-site.tar.xz.tmp .bench/unsloth-site.tar.xz
  echo "[archives] .bench/unsloth-site.tar.xz: $(du -h .bench/unsloth-site.tar.xz | cut -f1) (${UNSLOTH_PINS[*]})"
}

case "$what" in
  site) site ;;
  assets) assets ;;
  unsloth) unsloth ;;
  all) site; assets; unsloth ;;
  *) echo "usage: bench/archives.sh [site|assets|unsloth|all]"; exit 2 ;;
esac
