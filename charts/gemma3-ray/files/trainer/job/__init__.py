"""job: what the driver on the Ray head imports, the standard library, Ray and pyarrow only.

Owns: the flags declared (``flags``; the speed levers' rows, their flags among them: ``lever_table``), read and checked together (``arguments``), the JSON- and
template-valued ones read into what the job uses (``flag_values``); where files live (``storage``, ``node_cache``); a run's
identity and what it keeps (``runs``, ``run_definition``, ``checkpoint_manifest``, ``stored``); the data
checked on the head (``dataset_check``; a streaming dataset's manifest and shards: ``shard_manifest``; a shard's
bytes read and checked against its sha256 by a Ray Data task that may run on any node, the head too: ``shard_read``); the batch shape on
every worker count and each epoch's counts
(``elastic``, ``epochs``); the job start split (``startup_timing``); the report page (``run_report``);
Ray Train's torch backend without torch on the head (``torch_backend``); what only the workers install
(``worker_runtime_env``); a usage error's stop of every rank (``usage_stop``).

May import: nothing (no other folder; third-party: ray and pyarrow, which Ray Train brings).
"""
