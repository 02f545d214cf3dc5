# A script, sourced bare on the GPU machine by bench/e2e_ray*.sh (from the repository root).
# The package bundle (.whl, from ../shared/device/make-bundle.sh) and the bench assets (.bench/assets.tar.xz,
# from `python3 -m bench.bench prepare`), both carried by the device tool.
if [ ! -d /tmp/site/ray ]; then
  rm -rf /tmp/site && mkdir -p /tmp/site && tar xJf .whl/site.tar.xz -C /tmp/site
fi
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAY_TRAIN_ENABLE_PRINT_PATCH=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -d .bench/assets ] || { mkdir -p .bench && tar xJf .bench/assets.tar.xz -C .bench; }
