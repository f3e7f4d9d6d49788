"""Passwords never printed: every credential of a storage or tracking URL is masked in any text.

tuner's own messages use :func:`tuner.config.redact` on the URLs they name, but third-party
exception text quotes URLs too (MLflow's ``API request to http://u:PASSWORD@host/...``). So the
CLI registers the password of every URL it was given (:func:`register`) and every password the
environment holds for the libraries (:func:`register_secrets`, ``tuner.config.environment_secrets``:
``PGPASSWORD``, ``MLFLOW_TRACKING_PASSWORD``, ...) and wraps ``sys.stdout``
and ``sys.stderr`` (:func:`install`): whatever is written there, by tuner, a library's logger or a
traceback, goes through :func:`mask` first.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
_USERINFO = re.compile(r"(//[^/:@\s]+:)[^/@\s]+@")
_SECRETS: set[str] = set()  # every password registered so far, in its raw and URL-quoted forms


def password_of(url: str | None) -> str | None:
    """The password in ``url``'s ``user:password@`` part, URL-decoded (None if it has none)."""
    if not url:
        return None
    try:
        secret = urlsplit(url).password
    except ValueError:
        match = _USERINFO.search(url)
        secret = match.group(0).rsplit(":", 1)[-1][:-1] if match else None
    return unquote(secret) if secret else None


def register(*urls: str | None) -> None:
    """Mask the passwords of these URLs in everything :func:`mask` sees from now on."""
    register_secrets(*(password_of(url) for url in urls))


def register_secrets(*secrets: str | None) -> None:
    """Mask these passwords (taken from the environment or a file, not from a URL) from now on."""
    for secret in secrets:
        if secret:
            _SECRETS.update({secret, quote(secret, safe=""), quote(secret)})


def mask(text: str) -> str:
    """``text`` with every registered password and any ``user:password@`` in a URL replaced."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _USERINFO.sub(rf"\g<1>{MASK}@", text)


class MaskedStream:
    """A text stream that masks what is written before passing it on (see the module docs)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        self.stream.write(mask(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def install() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`MaskedStream` (once)."""
    if not isinstance(sys.stdout, MaskedStream):
        sys.stdout = MaskedStream(sys.stdout)
    if not isinstance(sys.stderr, MaskedStream):
        sys.stderr = MaskedStream(sys.stderr)
