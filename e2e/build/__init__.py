"""build: what the local cluster runs and pulls, built here once and cached by content outside the clone
(``$GEMMA3_RAY_CACHE``, default ~/.cache/gemma3-ray): ``parts.sh`` (Kubernetes, CoreDNS, KubeRay, Kueue,
ct, registry from their Go modules; ``module_zip`` for a version the module proxy refuses) and
``image.sh`` (the base, trainer and storage images; ``host_config`` reads this machine's mirrors). Both
Python modules are run by the scripts with the machine's python3, standard library only.

May import: nothing
"""
