"""support.storage: the run's storage, what the pods read the inputs from and write their outputs to:
``run_storage`` (what both share), ``emulator`` (fake-gcs-server in the cluster) and ``bucket``
(E2E_BUCKET, a real bucket)."""
