"""stages: the stages of `make e2e`, one module per group; each stage a function of the Harness that
returns what it saw and raises StageError when its claim is false.

``setup`` (the cluster, the images, the preflight, storage and inputs), ``first_run`` (install to the
NOTES commands), ``chart_testing`` (ct), ``day_two`` (upgrade, rollback, uninstall, lost pods, elastic),
``shared_cluster`` (Kueue), ``kuberay`` (deletion rules, capacity flavors), ``streaming``, ``release`` (the chart pushed to an OCI registry
and installed by digest; opt-in: ``--only release``), ``fleet`` and ``fleet_kueue`` (simulated GPU pools, the
capacity fallback of the real Kueue on them; opt-in: ``--only fleet``).

May import: support
"""
