"""Command-line entry point: `gemma3-ray COMMAND` and, as a Helm plugin, `helm gemma3-ray COMMAND`."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gemma3_ray import __version__
from gemma3_ray.cli import common, values_check_command
from gemma3_ray.config import fits
from gemma3_ray.config.clients import Clients
from gemma3_ray.utils import errors, tokens
from gemma3_ray.utils.errors import EXIT_FAILURE, UserError

Handler = Callable[[argparse.Namespace, Clients | None], int]

DESCRIPTION = """\
Fine-tune Gemma 3 with Ray on GKE: values for the gemma3-ray chart from your gcloud configuration,
and the Google Cloud prerequisites Helm cannot create (bucket, service account, IAM, Workload Identity).

Settings come from flags, else the GKE kube context (gke_PROJECT_LOCATION_NAME), else the active
gcloud configuration ($CLOUDSDK_CONFIG or ~/.config/gcloud; --configuration picks another one).
"""


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--hf-token`` is not ``--hf-token-from-env``), whose errors never
    echo an argument's value (it may be a token typed by mistake). Sub-commands inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._argv: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        super().error(tokens.scrub(redact(message, self._argv)))


_MIN_REDACTED_LEN = 3


def redact(message: str, argv: Sequence[str]) -> str:
    """An argparse error without any value from the command line (flag names stay)."""
    if message.startswith("unrecognized arguments:"):
        flags = [t.split("=", 1)[0] for t in argv if t.startswith("-") and len(t) > 1
                 and t.split("=", 1)[0] in message]
        hint = ""
        if any(f.startswith("--hf-token") for f in flags):
            hint = "; pass the token with --hf-token-file - (typed without echo) or --hf-token-from-env VAR"
        named = f" {', '.join(dict.fromkeys(flags))}" if flags else ""
        return f"unrecognized arguments:{named} (values not shown){hint}"
    message = re.sub(r"(invalid [\w ]+? value): .*$", r"\1 (the value is not shown)", message)
    message = re.sub(r"invalid choice: .*? \(choose from", "invalid choice (not shown; choose from", message)
    for token in argv:
        value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
        if len(value) >= _MIN_REDACTED_LEN and not value.startswith("-") and value in message:
            message = message.replace(value, "(value not shown)")
    return message


def cmd_values(args: argparse.Namespace, clients: Clients | None) -> int:
    from gemma3_ray.config import render
    from gemma3_ray.gcp import image_build

    if values_check_command.checking(args):
        return values_check_command.cmd_check(args)

    existing = render.load(Path(args.output)) if args.output else None
    # The model's size picks the fit table's cell: --model-size, else the id --model gives, else the one the values
    # file already has (training.model_id), else the chart's default (4B). Checked before anything is resolved.
    size = render.model_size([dict(existing or {}), {"training": {"model_id": args.model}} if args.model else {}],
                             args.model_size)
    dep, clients = common.resolve(args, clients)
    extra = [render.Value(("training", "model_id"), args.model, f"Gemma 3 {size.upper()}")] if args.model else []
    extra += image_build.values(dep, clients) if args.image else []
    if args.output:
        path = Path(args.output)
        text = render.render(dep, existing, extra, size)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        print(f"wrote {tokens.shown(path)}", file=sys.stderr)
    else:
        sys.stdout.write(render.render(dep, extra=extra, size=size))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gemma3-ray", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("values", help="write a values file for the chart from gcloud state; --check FILE: check one "
                       "written for an earlier chart version")
    common.add_common(p)
    p.add_argument("-o", "--output", help="values file to write; an existing one is updated in place "
                   "(its comments, order and other keys kept). Default: stdout")
    p.add_argument("--image", action="store_true", help="also the training image built by `image build` for these "
                   "sources (an error if it is not built); without it, image keys an earlier --image wrote are removed")
    p.add_argument("--model", help="the Gemma 3 vision model to fine-tune (training.model_id: a hub id, gs:// or local "
                   "directory); its size picks the recipe and micro-batch that fit the GPU (config/fits.toml). "
                   "Default: the values file's training.model_id, else google/gemma-3-4b-it")
    p.add_argument("--model-size", choices=fits.SIZES, help="the model's Gemma 3 size, when its id does not name it")
    values_check_command.add_flags(p)
    p.set_defaults(handler=cmd_values)
    _register_more(sub)
    return parser


def _register_more(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The commands that talk to Google Cloud and the cluster (defined in their own modules)."""
    from gemma3_ray.cli import (
        chart_release_command,
        cluster_commands,
        data_command,
        kueue_command,
        release_commands,
        report_command,
    )

    release_commands.register(sub, common.add_common)
    cluster_commands.register(sub, common.add_common)
    report_command.register(sub, common.add_common)
    kueue_command.register(sub)
    data_command.register(sub)
    chart_release_command.register(sub)


def main(argv: Sequence[str] | None = None, clients: Clients | None = None) -> int:
    # Everything the command prints, whichever module prints it, goes through the token redaction on its way
    # out: a value typed where a token does not belong is never echoed back (a message may quote its input).
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = tokens.ScrubbedStream(out), tokens.ScrubbedStream(err)
    try:
        return _run(argv, clients)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = out, err


def _run(argv: Sequence[str] | None, clients: Clients | None) -> int:
    # Libraries' log lines (pyhelm3's "command failed", the kubernetes client's exec-plugin errors on the root
    # logger) never reach the terminal: every outcome is said once, as a sentence.
    logging.getLogger().addHandler(logging.NullHandler())
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args, clients)
    except UserError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        print("gemma3-ray: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # every other error: a connection error in one sentence, else a bug
        net = errors.unreachable(exc)
        if net is not None:
            return _fail(str(net), EXIT_FAILURE)
        from gemma3_ray.cli import bug_report

        try:
            path = bug_report.write(exc, list(sys.argv[1:] if argv is None else argv))
        except OSError:
            path = None
        return _fail(bug_report.sentence(exc, path), errors.EXIT_BUG)


def _fail(message: str, code: int) -> int:
    print(f"gemma3-ray: error: {tokens.scrub(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
