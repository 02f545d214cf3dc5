"""runner: what `python -m e2e` does from start to end, and nothing a stage does.

The command line (--only/--skip, --keep), the stage table (``table``: one row per stage, in order, and
its walk: the selection, the preconditions, E2E_DEADLINE), the entry (``cli``), the clean-up on every
exit path (``cleanup``) and the line CI prints from summary.json (``verdict``). `python -m e2e.runner.table` prints the table the chart README cites.

May import: stages, support
"""
