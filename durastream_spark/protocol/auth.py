"""The user's request headers: ``header.*`` options plus the bearer token from ``tokenFile``.

The token file is read where the request is sent (driver or executor) and re-read whenever it changes, so a
rotated token (a refreshed secret mount) is used by a query that runs for days. Reads are cached on the file's
identity (inode, size, mtime) so a request costs one ``stat``, not one read.
"""

from __future__ import annotations

import os

from durastream_spark.errors import OptionError
from durastream_spark.options import TOKEN_FILE, ConnectionOptions

_tokens: dict[str, tuple[tuple[int, int, int], str]] = {}


def read_token(path: str) -> str:
    """The stripped content of a token file, cached until the file changes."""
    accepted = "a readable file holding a bearer token"
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise OptionError(
            TOKEN_FILE,
            path,
            accepted,
            reason=f"cannot stat it in pid {os.getpid()}: {exc.strerror}",
        ) from None
    identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    cached = _tokens.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(TOKEN_FILE, path, accepted, reason=f"cannot read it: {exc}") from None
    if not token:
        raise OptionError(TOKEN_FILE, path, accepted, reason="the file is empty")
    if any(ch in token for ch in "\r\n\0"):
        raise OptionError(TOKEN_FILE, path, accepted, reason="the token spans several lines")
    _tokens[path] = (identity, token)  # a single dict store: atomic under the GIL, no lock to fork
    return token


def request_headers(connection: ConnectionOptions) -> dict[str, str]:
    """Headers every request carries. Contains secrets: never log it or put it in an exception."""
    headers = connection.reveal_headers()
    if connection.token_file is not None:
        headers["Authorization"] = f"Bearer {read_token(connection.token_file)}"
    return headers
