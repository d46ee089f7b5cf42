"""The workers' own credential with ``--workers N`` and ``--auth-token`` (decision 0009).

Some requests between workers carry no client's token: the followers of another shard's change feed
and the listing a subscription's backfill reads (``subscriptions.py``), and the events a pull-wake
appends to a wake stream of another shard. The server keeps only digests of the configured tokens
(``auth.py``), so a worker has none to present; this credential is what it presents instead.

* Made by the parent (``supervisor.py``) before any worker starts: 32 random bytes, written to
  ``internal-token`` (mode 0600) in the workers' socket directory, which is itself private to the
  server's user (``tempfile.mkdtemp``: 0700) and removed when the parent exits. A new one every start
  of the parent; never in a command line or the environment (other users can read both in
  ``/proc``), never logged (``repr`` redacts it), never in ``/metrics``.
* Presented in its own header, ``HEADER``, not ``Authorization``: a forwarded client's request keeps
  its ``Authorization`` for the owner to check, while ``HEADER`` is dropped from every request a
  worker relays (``router._send_request``, ``fanout.request_head``), so a client cannot have a worker
  carry it onto the internal sockets.
* Accepted only on a request that arrived over a worker's Unix socket (``ShardRouter.from_worker``):
  presented over TCP (the public port, a connection handed over between workers included) it is
  nothing, and the request needs a configured token like any other (401 without one). It grants what
  a read-write token without prefix grants.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Final

from durastream_server.auth import AuthToken, Mode, digest

FILE: Final = "internal-token"
HEADER: Final = "x-durastream-internal"
# What a request presenting the credential on a worker's socket is authorized as.
TOKEN: Final = AuthToken(
    digest=b"", mode=Mode.READ_WRITE, prefix="", source="the workers' internal credential"
)


class InternalCredential:
    """The credential's text (sent by this worker) and digest (compared against what is presented)."""

    __slots__ = ("_value", "_digest")

    def __init__(self, value: str) -> None:
        self._value = value
        self._digest = digest(value)

    @classmethod
    def create(cls, directory: Path) -> InternalCredential:
        """A new credential, written to ``directory/FILE`` (0600, created here: never an existing
        file someone else prepared)."""
        credential = cls(secrets.token_urlsafe(32))
        path = directory / FILE
        path.unlink(missing_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(credential._value)
        return credential

    @classmethod
    def load(cls, directory: Path) -> InternalCredential:
        """The credential the parent wrote for this run; a clear error when it is not there (a worker
        is started by its parent, ``--workers N``, never by hand)."""
        path = directory / FILE
        try:
            value = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise RuntimeError(
                f"cannot read the workers' internal credential {path} ({exc}); a worker is started "
                "by its parent process (--workers N)"
            ) from None
        if not value:
            raise RuntimeError(f"the workers' internal credential {path} is empty")
        return cls(value)

    def header_line(self) -> bytes:
        """The request header line that presents the credential to another worker."""
        return f"{HEADER}: {self._value}\r\n".encode("ascii")

    def matches(self, presented: str) -> bool:
        """Whether ``presented`` is this credential (compared as digests, in constant time)."""
        return hmac.compare_digest(digest(presented), self._digest)

    def __repr__(self) -> str:
        return "InternalCredential(<redacted>)"
