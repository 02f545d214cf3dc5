"""release: what one release (a namespace and a release name) needs and is, across the folders below.

Owns: the prerequisites Helm cannot create — Google Cloud identities, grants and bucket, and the HF
token Secret (``prereqs``) — and their removal (``teardown``); ``doctor``'s checks end to end
(``doctor``, with the GKE and image checks in ``doctor_gke``); ``up``'s flow, each module it uses
entered once (``up``); ``status`` (``status``); ``down`` (``down``).

May import: utils, config, kube, gke, gcp, kueue.
"""
