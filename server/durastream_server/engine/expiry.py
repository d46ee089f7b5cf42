"""Stream lifetimes: sliding TTL and absolute Expires-At (section 4, 5.1), and fork inheritance (4.2).

Expiry is decided here as a pure function of the stream's configuration, its last access and the clock.
Nothing in a read path deletes anything (hazard 26): an expired stream simply *answers* as gone until
the engine's background sweeper removes it.

Last-access times are kept in memory only (persisting them would turn every GET into a disk write).
After a restart every stream counts as accessed at start-up: losing the bookkeeping must never be the
reason data is deleted. Expires-At is absolute and unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from durastream_server.errors import BadRequest


@dataclass(frozen=True, slots=True)
class Lifetime:
    """A stream's expiry configuration: at most one of the two is set."""

    ttl_seconds: int | None = None
    expires_at: str | None = None  # normalized RFC 3339 text (format_rfc3339)

    @property
    def expires(self) -> bool:
        return self.ttl_seconds is not None or self.expires_at is not None


def format_rfc3339(moment: datetime) -> str:
    """Normalize a timezone-aware datetime to UTC RFC 3339 text (``...T..:..:..[.fff[fff]]Z``).

    The same instant always gives the same text, so idempotent PUT can compare the strings.
    """
    if moment.tzinfo is None:
        raise BadRequest("Stream-Expires-At must carry a timezone")
    utc = moment.astimezone(timezone.utc)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        frac = f"{utc.microsecond:06d}"
        frac = frac[:3] if frac.endswith("000") else frac
        text += "." + frac
    return text + "Z"


def parse_rfc3339(text: str) -> datetime:
    """Parse text produced by ``format_rfc3339`` (or any ISO 8601 form Python accepts)."""
    value = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


def requested(ttl_seconds: int | None, expires_at: datetime | None) -> Lifetime:
    """Validate a create request's lifetime headers (section 5.1: both at once is 400)."""
    if ttl_seconds is not None and expires_at is not None:
        raise BadRequest("Stream-TTL and Stream-Expires-At are mutually exclusive")
    if ttl_seconds is not None and ttl_seconds < 0:
        raise BadRequest("Stream-TTL must be a non-negative integer")
    return Lifetime(
        ttl_seconds=ttl_seconds,
        expires_at=format_rfc3339(expires_at) if expires_at is not None else None,
    )


def for_fork(source: Lifetime, request: Lifetime) -> Lifetime:
    """Section 4.2 table: a fork's own TTL/Expires-At wins; without one it inherits the source's."""
    return request if request.expires else source


def deadline(lifetime: Lifetime, last_access: float) -> float | None:
    """Epoch seconds at which the stream expires, or None if it never does."""
    if lifetime.expires_at is not None:
        return parse_rfc3339(lifetime.expires_at).timestamp()
    if lifetime.ttl_seconds is not None:
        return last_access + lifetime.ttl_seconds
    return None


def is_expired(lifetime: Lifetime, last_access: float, now: float) -> bool:
    limit = deadline(lifetime, last_access)
    return limit is not None and now >= limit
