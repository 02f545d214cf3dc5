"""cli: the command line — ``gemma3-ray COMMAND`` and, as a Helm plugin, ``helm gemma3-ray COMMAND``.

Owns: argument parsing with redacted errors and the entry point (``entry``), the plan-by-default
``--apply`` convention (``apply_flag``), the flags several commands share and the ``Deployment`` and
clients they resolve to (``common``), the bug report of an unexpected error (``bug_report``), and
each command's flags and handler: prereqs, doctor, up, status, logs, down (``release_commands``);
cluster create/delete/status and image build (``cluster_commands``); kueue setup
(``kueue_command``); report (``report_command``); data shard (``data_command``); values --check, a values
file written for an earlier chart version (``values_check_command``); release, the chart
to an OCI registry (``chart_release_command``). A handler parses, then hands values (never the
``argparse.Namespace``) to the folder that does the work. Nothing below imports the CLI.

May import: utils, config, kube, gke, gcp, kueue, release.
"""

from gemma3_ray.cli.entry import build_parser, main, redact

__all__ = ["build_parser", "main", "redact"]
