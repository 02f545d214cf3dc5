"""The local kit: this machine's stand-ins for the cluster, for the demo, e2e/, bench/ and the tests.

- ``local_cluster``: a private Ray head on 127.0.0.1 (the RayJob's cluster; jobs go in through the same
  Ray Jobs API);
- ``fake_gcs``: fake-gcs-server on disk (the run's Cloud Storage bucket, the same ``gs://`` paths);
- ``host``: this machine checked first: free ports, memory, other Ray clusters, Ray's Jobs API packages;
- ``processes``: what the kit started, stopped by process id with its descendants (never ``ray stop``);
- ``tiny_model``: a tiny random Gemma 3 with the real Gemma 3 tokenizer and processor, built offline;
- ``sample_data``: products in the tutorial's dataset schema, made from scikit-learn's scanned digits;
- ``chart_job``: what the chart's RayJob would run (the rendered ConfigMap's trainer files, entry point
  and runtime env), taken from ``helm template`` and made runnable here;
- ``errors``: ``LocalKitError``, the kit's one error: one sentence saying what to do.

``python -m demo`` (``make demo``) is its first user; see localkit/README.md.
"""
