#!/usr/bin/env bash
# A script, run bare on the GPU machine (bash, from the repository root).
# The streamed counterpart of bench/e2e_ray.sh (#32): the same synthetic rows, sharded by the plugin's own
# `gemma3-ray data shard` into a local directory, trained with --streaming=true (Ray Data reads the shards, its
# CPU stage decodes and tokenises, one streaming_split per worker). Compare its samples/s and the summary's
# streaming.data_wait_s with bench/e2e_ray.sh's on the same NUM_WORKERS, E2E_ROWS and E2E_STEPS.
#   bench/e2e_ray_streaming.sh NUM_WORKERS [extra trainer flags, e.g. --streaming_decoders=8]
# Needs the plugin's packages (google-cloud-storage, google-api-core: `pip install .` from the repository).
set -euo pipefail
. bench/device_env.sh
W=${BENCH_WORK:-/tmp/gemma3-bench}
data=$(python3 -m bench.bench data --rows "${E2E_ROWS:-600}" | tail -n1)
shards="$W/shards-${E2E_ROWS:-600}"
PYTHONPATH="$PWD/plugin${PYTHONPATH:+:$PYTHONPATH}" python3 -m gemma3_ray data shard "$data" --to "$shards" \
  --shard-size "${E2E_SHARD_SIZE:-64MB}" --apply
n=$1; shift
exec bash bench/e2e_ray.sh "$n" --dataset_name="$shards" --streaming=true "$@"
