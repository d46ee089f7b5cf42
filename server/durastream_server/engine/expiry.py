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
from typing import Final

from durastream_server.errors import BadRequest


@dataclass(frozen=True, slots=True)
class Lifetime:
    """A stream's expiry configuration: at most one of the two is set."""

    ttl_seconds: int | None = None
    expires_at: str | None = None  # normalized RFC 3339 text (format_rfc3339)

    @property
    def expires(self) -> bool:
        return self.ttl_seconds is not None or self.expires_at is not None


FOREVER = Lifetime()  # no TTL, no Expires-At (immutable, so one for every such stream)


# Every instant a datetime can hold in UTC: RFC 3339 years are four digits, and Python has no year 0.
# A requested Expires-At outside this range (``9999-12-31T23:59:59-23:59`` is in year 10000 in UTC) is
# rejected at parse time: nothing outside it can be stored, formatted or compared.
EARLIEST: Final = datetime.min.replace(tzinfo=timezone.utc)
LATEST: Final = datetime.max.replace(tzinfo=timezone.utc)


def in_utc(moment: datetime) -> datetime:
    """``moment`` in UTC. Raises ``ValueError`` if it is naive or its UTC instant is outside
    ``EARLIEST..LATEST`` (``astimezone`` raises ``OverflowError`` there)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("an expiry time needs a time zone")
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"{moment.isoformat()} is outside {RANGE}") from None


def format_rfc3339(moment: datetime) -> str:
    """Normalize a timezone-aware datetime to UTC RFC 3339 text (``YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z``).

    The same instant always gives the same text, so idempotent PUT can compare the strings. Every field
    is zero-padded by hand: ``strftime("%Y")`` gives ``999`` for the year 999 (glibc does not pad),
    which ``fromisoformat`` then refuses. Raises ``ValueError`` as ``in_utc`` does.
    """
    utc = in_utc(moment)
    text = (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}"
        f"T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    )
    if utc.microsecond:
        frac = f"{utc.microsecond:06d}"
        frac = frac[:3] if frac.endswith("000") else frac
        text += "." + frac
    return text + "Z"


RANGE: Final = f"{format_rfc3339(EARLIEST)} to {format_rfc3339(LATEST)}"


def parse_rfc3339(text: str) -> datetime:
    """Parse text produced by ``format_rfc3339`` (or any ISO 8601 form Python accepts). Raises
    ``ValueError`` for anything else."""
    value = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


def requested(ttl_seconds: int | None, expires_at: datetime | None) -> Lifetime:
    """Validate a create request's lifetime headers (section 5.1: both at once is 400).

    The Expires-At text is parsed back before it is accepted, so what reaches the stream's header is
    exactly what every later start-up can read (a header it cannot read is quarantined).
    """
    if ttl_seconds is not None and expires_at is not None:
        raise BadRequest("Stream-TTL and Stream-Expires-At are mutually exclusive")
    if ttl_seconds is not None and ttl_seconds < 0:
        raise BadRequest("Stream-TTL must be a non-negative integer")
    text = None
    if expires_at is not None:
        try:
            text = format_rfc3339(expires_at)
            if parse_rfc3339(text) != expires_at:
                raise ValueError(f"{text!r} does not parse back to the same instant")
        except ValueError as exc:
            raise BadRequest(
                f"Stream-Expires-At must be a time from {RANGE}, got {expires_at.isoformat()!r} "
                f"({exc})"
            ) from None
    return Lifetime(ttl_seconds=ttl_seconds, expires_at=text)


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
