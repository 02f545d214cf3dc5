"""The Hugging Face token: read from an environment variable, a file or stdin — never from argv.

Nothing here ever prints the token or any value given where a token might have been typed: a flag
that takes a variable *name* refuses a value that looks like a token without echoing it, and every
hint keeps the token out of the command line and the shell history (``read -rs``, a file, stdin).
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import sys
from pathlib import Path

from gemma3_ray.errors import InvalidName, MissingSetting

# An environment variable name (POSIX: letters, digits, '_', not starting with a digit).
_VAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Hugging Face user access tokens start with "hf_" (https://huggingface.co/docs/hub/security-tokens).
_HF_TOKEN_PREFIX = "hf_"
# A variable name longer than this, mixing cases and digits, is far more likely a pasted secret.
_SECRET_LIKE_MIN_LEN = 24
STDIN = "-"
SAFE_EXPORT = "read -rs HF_TOKEN && export HF_TOKEN"  # read -s: typed without echo, never in history
REVOKE_HINT = "if it was a real token it is now in your shell history: revoke it at https://huggingface.co/settings/tokens"


def looks_like_token(value: str) -> bool:
    """True for a Hugging Face token, or for a long mixed-case/digit string no one names a variable."""
    if value.lower().startswith(_HF_TOKEN_PREFIX):
        return True
    mixed = any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)
    return len(value) >= _SECRET_LIKE_MIN_LEN and mixed


def shown(value: str) -> str:
    """How an error names a value the user gave: quoted, unless it looks like a token (then not at all)."""
    return "(value not shown: it looks like a token)" if looks_like_token(value) else repr(value)


def variable_name(flag: str, value: str) -> str:
    """Check a flag value that must name an environment variable; the value is never printed."""
    if looks_like_token(value):
        raise InvalidName(
            f"{flag} takes the NAME of an environment variable, and the value given looks like a token (not "
            f"shown; {REVOKE_HINT}): run `{SAFE_EXPORT}`, then pass {flag} HF_TOKEN, or use --hf-token-file -.")
    if not _VAR_NAME_RE.match(value):
        raise InvalidName(
            f"{flag} takes the NAME of an environment variable (letters, digits and '_', e.g. HF_TOKEN), and the "
            f"value given is not one (not shown): run `{SAFE_EXPORT}`, then pass {flag} HF_TOKEN.")
    return value


def _from_env(var: str) -> str:
    variable_name("--hf-token-from-env", var)
    token = os.environ.get(var, "").strip()
    if not token:
        raise MissingSetting(f"--hf-token-from-env {var}: the environment variable {var} is empty or unset; set it "
                             f"without echo (`read -rs {var} && export {var}`) and try again.")
    return token


def _from_file(path: str) -> str:
    if path == STDIN:
        if sys.stdin.isatty():
            token = getpass.getpass("Hugging Face token (not echoed): ")
        else:
            token = sys.stdin.read()
        where = "stdin"
    else:
        try:
            token = Path(path).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise MissingSetting(f"--hf-token-file: cannot read {path} ({exc.strerror}); pass a readable file, or - "
                                 "to type the token without echo.") from None
        where = path
    token = token.strip()
    if not token:
        raise MissingSetting(f"--hf-token-file: {where} holds no token; put the token in it (`umask 077; cat > FILE`), "
                             "or pass - to type it without echo.")
    if any(c.isspace() for c in token):
        raise InvalidName(f"--hf-token-file: {where} holds more than one word; it must hold only the token.")
    return token


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--hf-token-from-env VAR | --hf-token-file PATH|- (the Secret is created from either)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hf-token-from-env", metavar="VAR",
                   help="create the Hugging Face token Secret from environment variable VAR (its name, never the token)")
    g.add_argument("--hf-token-file", metavar="PATH",
                   help="create the Hugging Face token Secret from the file PATH, or '-' for stdin "
                   "(prompts without echo on a terminal)")


def from_args(args: argparse.Namespace) -> str | None:
    """The token named by the flags, or None when neither was given."""
    var = getattr(args, "hf_token_from_env", None)
    if var:
        return _from_env(var)
    path = getattr(args, "hf_token_file", None)
    if path:
        return _from_file(path)
    return None
