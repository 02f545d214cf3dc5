"""`make e2e` (`python -m e2e`): the chart on a real Kubernetes, stage by stage (e2e/README.md).

Its folders, top floor first; each imports only the floors below it that its ``__init__`` names:
``runner/`` (the command line, the stage table and its walk, the clean-up), ``stages/`` (one module per
group of stages), ``support/`` (what the stages share: errors, the record, kubectl and helm, processes,
the harness, the session, storage), and beside them ``cluster/`` (the local one-node cluster) and
``build/`` (its parts and images, built once and cached), shell scripts with the Python they run.
"""
