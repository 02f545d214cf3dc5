"""support: what the stages and the runner share, and nothing that knows a stage.

The errors (``errors``), the record of a run (``record``: rows, the printed table, summary.json),
kubectl and helm (``kube``), processes and signals (``proc``), the Harness a stage is given
(``harness``), the run's id, lock and leftovers (``session``), its Lease (``lease``), the nodes it may
change and puts back (``nodes``), what the cluster offers (``preflight``, ``versions``), the NOTES commands'
kinds (``notes_check``), a throwaway chart-signing key (``signing_key``), the run's storage (``storage/``: the
emulator in the cluster or a real bucket), and the simulated GPU fleet: GKE-shaped pools as Node objects for
kwok (``fleet_nodes``), the cases the `fleet` stages place (``fleet_cases``), the pools and checks of
Kueue on GPUs (``fleet_fallback``) and the scheduler's filters as pure
logic (``placement``).

May import: nothing
"""
