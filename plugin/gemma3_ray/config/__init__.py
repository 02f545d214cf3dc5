"""config: what a command works on, resolved from the local machine before any change is made.

Owns: the gcloud configuration read from its files (``gcloud_state``), the kube context
(``kube_context``), the machine shape of a machine type or reservation (``machine_shapes``; the one
API call here reads a ``--reservation`` through the client it is given), the ``Deployment`` resolved
from flags > kube context > gcloud configuration (``deployment``), the lazily made clients, Google
Cloud's and the cluster's (``clients``: its ``Kube`` is the one place a Kubernetes connection is made,
once per command), the chart's values file (``render``) and its release rule: version, appVersion
(``chart_version``), the content digest each version records in CHANGELOG.md (``chart_digest``) and the values
keys each version moved, checked in a values file written for an earlier one (``values_moved``).

May import: utils.
"""
