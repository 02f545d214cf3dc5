"""kube: the Kubernetes cluster, through the ``kubernetes`` client and the ``helm`` binary.

Owns: objects inside the cluster, through the API clients ``config.clients.Kube`` makes — the HF
token Secret, the RayJob (followed until it ends), its driver log, the Ray dashboard through the API
server, CRD reads (``cluster``); the Helm release: template,
upgrade --install, uninstall (``helm_release``); the chart as an OCI artifact — package, sign,
push (``chart_package``), what a registry already holds at a version (``chart_registry``) and ``release``'s flow
(``chart_publish``); which RayJob fields the installed KubeRay CRD knows
(``kuberay_crd``).

May import: utils, config.
"""
