"""gke: the GKE cluster itself, through Google's Container API.

Owns: the cluster and its node pools — plan, create or complete, delete, status (``cluster``), a GPU
pool as flex-start VMs or with queued provisioning (``flex_start``), and the NVIDIA driver rule: the
driver the pinned torch needs against the one GKE installs (``gpu_driver``).

May import: utils, config.
"""
