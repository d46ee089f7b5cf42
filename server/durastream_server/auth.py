"""Bearer tokens: what ``--auth-token`` and ``--auth-token-file`` configure, parsed and validated once.

A token grants a *mode* (``read-only`` or ``read-write``) on the streams under a *prefix* (all streams when
there is none). The HTTP layer (``http/auth.py``) decides per request; this module only turns operator
input into ``AuthToken`` values and says precisely what is wrong with bad input.

Secrets: the token text is kept only as its SHA-256 digest (``AuthToken.digest``), which is what requests
are compared against (in constant time). No repr, log line or error message built here contains a token:
errors about a token name its position (``--auth-token #2``, ``tokens.txt:7``), never its value.

Token file format (``--auth-token-file PATH``), one token per line::

    # comments start with '#'; blank lines are ignored
    # TOKEN                                     MODE         [PREFIX]
    4mXJ3k0vT3u2c6-9yQ0mRkq1sQH2mZ0bKx1H7mV9w  read-write
    Zk8nq1WcX2d4L0pP7rT9uV3yB6eG5hJ8kM1nQ4sT  read-only    tenant-a
    Yc3mR8tW1qE6uI9oP2aS5dF8gH1jK4lZ7xC0vB3n  read-write   tenant-b/ingest

Fields are separated by whitespace. ``TOKEN`` uses the RFC 6750 ``b64token`` alphabet (letters, digits,
``-._~+/``, trailing ``=``) and is at least ``MIN_TOKEN_CHARS`` long. ``PREFIX`` is a stream-root-relative
path (``tenant-a`` covers ``tenant-a`` and everything under ``tenant-a/``, not ``tenant-ab``).
``--auth-token`` takes the same three fields joined by ``:`` (``TOKEN[:MODE[:PREFIX]]``; MODE defaults to
read-write).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Final

MIN_TOKEN_CHARS: Final = 16
_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
TOKEN_SYNTAX: Final = (
    f"at least {MIN_TOKEN_CHARS} characters from A-Z a-z 0-9 - . _ ~ + / (optionally ending in '='); "
    "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
)


class Mode(Enum):
    READ_ONLY = "read-only"
    READ_WRITE = "read-write"


MODES: Final = ", ".join(m.value for m in Mode)


class TokenConfigError(ValueError):
    """Operator input for tokens is wrong. The message says where and what, and never shows the token."""


def digest(token: str | bytes) -> bytes:
    raw = token.encode("latin-1", "replace") if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


@dataclass(frozen=True, slots=True)
class AuthToken:
    """One configured token: the digest of its text, its mode, and the stream prefix it is limited to."""

    digest: bytes = field(repr=False)
    mode: Mode = Mode.READ_WRITE
    prefix: str = ""  # canonical stream path ("" = every stream); see ``canonical_prefix``
    source: str = ""  # where it was configured ("--auth-token #1", "tokens.txt:3"), for messages

    @property
    def writable(self) -> bool:
        return self.mode is Mode.READ_WRITE

    def covers(self, path: str) -> bool:
        """Does the prefix include the canonical stream path ``path``? Segment-wise: a/b covers a/b/c."""
        return not self.prefix or path == self.prefix or path.startswith(self.prefix + "/")

    def __repr__(self) -> str:
        prefix = self.prefix or "*"
        return f"AuthToken(<redacted>, {self.mode.value}, prefix={prefix!r}, from {self.source})"


def canonical_prefix(text: str, where: str) -> str:
    """A prefix as the engine spells stream paths: segments joined by '/', '%' escaped inside them.

    Written as a decoded stream-root-relative path (``tenant-a/logs``), like subscription bodies. A leading
    ``/``, a leading ``/v1/stream/`` and a trailing ``/`` are tolerated; empty, ``.`` and ``..`` segments
    are refused.
    """
    value = text.strip()
    if value.startswith("/v1/stream/"):
        value = value[len("/v1/stream/") :]
    value = value.strip("/")
    if not value:
        raise TokenConfigError(
            f"{where}: the prefix is empty; leave it out to allow every stream, or give a stream path "
            "such as tenant-a"
        )
    segments = value.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise TokenConfigError(
                f"{where}: the prefix {text!r} has an empty, '.' or '..' segment; give a stream path "
                "such as tenant-a or tenant-a/logs"
            )
        if "\x00" in segment or any(ch.isspace() for ch in segment):
            raise TokenConfigError(f"{where}: the prefix {text!r} contains whitespace or NUL")
    return "/".join(segment.replace("%", "%25") for segment in segments)


def _mode(text: str, where: str) -> Mode:
    for mode in Mode:
        if text.strip().lower() == mode.value:
            return mode
    raise TokenConfigError(f"{where}: unknown mode {text!r}; expected one of {MODES}")


def _check_token(token: str, where: str) -> None:
    # Never echo the token: it may be a real secret with one typo in it.
    if not token:
        raise TokenConfigError(f"{where}: the token is empty; expected {TOKEN_SYNTAX}")
    if not _B64TOKEN.fullmatch(token):
        raise TokenConfigError(
            f"{where}: the token contains a character outside the allowed set; expected {TOKEN_SYNTAX}"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenConfigError(
            f"{where}: the token is {len(token)} characters long, too short to resist guessing; "
            f"expected {TOKEN_SYNTAX}"
        )


def _make(token: str, mode_text: str | None, prefix_text: str | None, where: str) -> AuthToken:
    _check_token(token, where)
    mode = Mode.READ_WRITE if mode_text is None else _mode(mode_text, where)
    prefix = "" if prefix_text is None else canonical_prefix(prefix_text, where)
    return AuthToken(digest=digest(token), mode=mode, prefix=prefix, source=where)


def parse_token_spec(spec: str, where: str = "--auth-token") -> AuthToken:
    """``TOKEN[:MODE[:PREFIX]]`` from the command line."""
    token, _, rest = spec.strip().partition(":")
    mode_text: str | None = None
    prefix_text: str | None = None
    if rest:
        mode_text, sep, prefix_text_raw = rest.partition(":")
        prefix_text = prefix_text_raw if sep else None
        if not mode_text:
            raise TokenConfigError(
                f"{where}: expected TOKEN[:MODE[:PREFIX]] with MODE one of {MODES}; the mode is empty"
            )
    return _make(token, mode_text, prefix_text, where)


def parse_token_file(path: Path) -> tuple[tuple[AuthToken, ...], list[str]]:
    """The tokens of a token file and warnings about it (e.g. readable by other users).

    Raises ``TokenConfigError`` naming the file and line of the first problem.
    """
    warnings: list[str] = []
    try:
        info = path.stat()
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise TokenConfigError(f"--auth-token-file {path}: not UTF-8 text") from None
    except OSError as exc:
        raise TokenConfigError(
            f"--auth-token-file {path}: cannot read it: {exc.strerror}"
        ) from None
    if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(
            f"--auth-token-file {path} is accessible by other users (mode "
            f"{stat.filemode(info.st_mode)}); restrict it with: chmod 600 {path}"
        )
    tokens = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{path}:{number}"
        content = line.strip()
        if not content or content.startswith("#"):
            continue
        fields = content.split()
        for index, text in enumerate(fields):
            if text.startswith("#"):  # a trailing comment ('#' is in no token)
                del fields[index:]
                break
        if len(fields) not in (2, 3):
            raise TokenConfigError(
                f"{where}: expected 'TOKEN MODE [PREFIX]' separated by spaces (MODE one of {MODES}), "
                f"found {len(fields)} field(s)"
            )
        tokens.append(_make(fields[0], fields[1], fields[2] if len(fields) == 3 else None, where))
    if not tokens:
        raise TokenConfigError(
            f"--auth-token-file {path}: no tokens in it; expected lines of 'TOKEN MODE [PREFIX]'"
        )
    return tuple(tokens), warnings


def check_unique(tokens: tuple[AuthToken, ...]) -> None:
    seen: dict[bytes, str] = {}
    for token in tokens:
        if token.digest in seen:
            raise TokenConfigError(
                f"the same token is configured twice ({seen[token.digest]} and {token.source}); "
                "each token must appear once, with one mode and prefix"
            )
        seen[token.digest] = token.source
