"""The Hugging Face token: read from an environment variable, a file or stdin — never from argv.

Nothing here ever prints the token or any value given where a token might have been typed: a flag
that takes a variable *name* refuses a value that looks like a token without echoing it, and every
hint keeps the token out of the command line and the shell history (``read -rs``, a file, stdin).
"""

from __future__ import annotations

import getpass
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from gemma3_ray.utils.errors import InvalidName, MissingSetting

# An environment variable name (POSIX: letters, digits, '_', not starting with a digit).
_VAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Hugging Face user access tokens are "hf_" and 34 letters and digits (https://huggingface.co/docs/hub/security-tokens);
# HF_TOKEN, HF_API_TOKEN or hf_home are names, not tokens.
_HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")
# A word this long mixing lower case, upper case and digits is far more likely a pasted secret than a name.
_WORD_RE = re.compile(r"[A-Za-z0-9_-]{24,}")
NOT_SHOWN = "(value not shown: it looks like a token)"
STDIN = "-"
SAFE_EXPORT = "read -rs HF_TOKEN && export HF_TOKEN"  # read -s: typed without echo, never in history
REVOKE_HINT = "if it was a real token it is now in your shell history: revoke it at https://huggingface.co/settings/tokens"


def _secret_word(word: str) -> bool:
    return any(c.islower() for c in word) and any(c.isupper() for c in word) and any(c.isdigit() for c in word)


def looks_like_token(value: str) -> bool:
    """True when a Hugging Face token, or a long mixed-case/digit word, appears anywhere in ``value``."""
    return bool(_HF_TOKEN_RE.search(value)) or any(_secret_word(w) for w in _WORD_RE.findall(value))


def scrub(text: str) -> str:
    """``text`` with every token-shaped word replaced (the last guard before anything is printed)."""
    text = _HF_TOKEN_RE.sub(NOT_SHOWN, text)
    return _WORD_RE.sub(lambda m: NOT_SHOWN if _secret_word(m.group(0)) else m.group(0), text)


class ScrubbedStream:
    """A text stream that writes through ``scrub``: what is complete up to a line end at once, the rest when a
    line ends or the stream is flushed (a prompt). The CLI writes everything through two of these."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        end = max(self._pending.rfind("\n"), self._pending.rfind("\r")) + 1
        if end:
            self.inner.write(scrub(self._pending[:end]))
            self._pending = self._pending[end:]
            self.inner.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.inner.write(scrub(self._pending))
            self._pending = ""
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the stream's own
        return getattr(self.inner, name)


def shown(value: object) -> str:
    """How a message names a value the user gave (a flag value, a path): quoted, unless it looks like a
    token (then not at all). Every message that quotes user input goes through here."""
    text = str(value)
    return NOT_SHOWN if looks_like_token(text) else repr(text)


def variable_name(flag: str, value: str) -> str:
    """Check a flag value that must name an environment variable; the value is never printed."""
    if looks_like_token(value):
        raise InvalidName(
            f"{flag} takes the NAME of an environment variable, and the value given looks like the token itself "
            f"(not shown; {REVOKE_HINT}): pass --hf-token-file - to type the token without echo, or put it in a "
            f"variable first (`{SAFE_EXPORT}`) and give that variable's name.")
    if not _VAR_NAME_RE.match(value):
        raise InvalidName(
            f"{flag} takes the NAME of an environment variable (letters, digits and '_'), and the value given is "
            f"not one (not shown): put the token in a variable (`{SAFE_EXPORT}`) and give its name, e.g. HF_TOKEN.")
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
            raise MissingSetting(f"--hf-token-file: cannot read {shown(path)} ({exc.strerror}); pass a readable file, "
                                 "or - to type the token without echo.") from None
        where = shown(path)
    token = token.strip()
    if not token:
        raise MissingSetting(f"--hf-token-file: {where} holds no token; put the token in it (`umask 077; cat > FILE`), "
                             "or pass - to type it without echo.")
    if any(c.isspace() for c in token):
        raise InvalidName(f"--hf-token-file: {where} holds more than one word; it must hold only the token.")
    return token


def read(from_env: str | None = None, from_file: str | None = None) -> str | None:
    """The token from the variable named ``from_env`` (--hf-token-from-env VAR) or the file ``from_file``
    (--hf-token-file PATH, ``-`` for stdin); None when neither was given."""
    if from_env:
        return _from_env(from_env)
    if from_file:
        return _from_file(from_file)
    return None
