"""gcp: the other Google Cloud APIs — IAM, Cloud Storage, Service Usage, Artifact Registry, Cloud Build.

Owns: turning APIs on (``services``), IAM read-modify-write (``iam_policy``), the permission
preflight (``iam_preflight``), a release's conditional grants on the shared bucket (``grants``), the
shared bucket (``bucket_setup``), the image repository and build staging bucket
(``artifact_registry``), the training image built by Cloud Build (``image_build``), and the runs in
the bucket: report.html and the newest checkpoint (``run_reports``), and datasets as shards for the
trainer's streaming path: the source read row by row (``shard_source``), the shards and their manifest
(``data_shards``).

May import: utils, config, gke (the node pools' service accounts, which pull the training image).
"""
