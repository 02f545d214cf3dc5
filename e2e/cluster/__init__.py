"""cluster: the local one-node Kubernetes of real parts (``cluster.sh`` start|stop|status|leftovers, with its
helpers ``lib.sh``, ``host.sh``, ``pki.sh``, ``config.sh``, ``images.sh``, ``operators.sh``, ``smoke.sh``),
the OCI registry beside it (``registry.sh``), and ``manifests``, which ``operators.sh`` runs with the
machine's python3. The parts come from e2e/build/parts.sh.

May import: nothing
"""
