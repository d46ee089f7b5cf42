"""Instants for the time-based options (``startingTimestamp``, ``endingOffsetsByTimestamp``, ...).

An instant is given as milliseconds since the Unix epoch (``1700000000000``, a JSON number or a string) or as
ISO-8601 text with a zone (``2024-01-31T12:00:00Z``, ``2024-01-31T13:00:00.250+01:00``). Text without a
zone is refused: a query whose start moves with the driver's time zone would read different data on
another cluster. Each instant resolves to the first message whose server append time is at or after it
(the server's time lookup, docs/extensions.md section 7); append times are whole milliseconds, so an
instant with a fraction of a millisecond is rounded up.

In offsets, a stream that starts (or ends) at an instant holds the symbolic value ``"timestamp <ms>"``
until a batch resolves it. The space makes it impossible to confuse with an offset a server minted
(offset tokens are printable ASCII without spaces), like ``"latest"``.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

from durastream_spark.errors import OptionError

ACCEPTED = (
    "milliseconds since the Unix epoch (e.g. 1700000000000) or an ISO-8601 instant with a zone "
    "(e.g. 2024-01-31T12:00:00Z or 2024-01-31T13:00:00.250+01:00)"
)
MAX_MS = 2**53 - 1  # what the server's time lookup accepts

_PREFIX = "timestamp "
_EPOCH_MS = re.compile(r"^[+-]?\d{1,16}$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]")


def parse_instant(option: str, raw: str | None, value: object, *, where: str = "") -> int:
    """Milliseconds since the epoch for ``value`` (an int, or text in one of the accepted forms).

    ``raw`` is the option's whole text (for the error); ``where`` says which part of it was wrong, e.g.
    ``"stream 'events/a'"``. Instants before 1970 are allowed (they resolve like 0).
    """
    shown = raw if raw is not None else str(value)
    prefix = f"{where}: " if where else ""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise OptionError(
            option, shown, ACCEPTED, reason=f"{prefix}{value!r} is neither a number nor text"
        )
    if isinstance(value, int):
        ms = value
    else:
        text = value.strip()
        if _EPOCH_MS.match(text):
            ms = int(text)
        elif _ISO_DATE.match(text):
            ms = _iso_ms(option, shown, text, prefix)
        else:
            raise OptionError(
                option, shown, ACCEPTED, reason=f"{prefix}{value!r} is not an instant"
            )
    if abs(ms) > MAX_MS:
        raise OptionError(option, shown, ACCEPTED, reason=f"{prefix}{value!r} is out of range")
    return ms


def _iso_ms(option: str, shown: str, text: str, prefix: str) -> int:
    candidate = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    try:
        parsed = datetime.fromisoformat(candidate)
    except ValueError:
        raise OptionError(
            option, shown, ACCEPTED, reason=f"{prefix}{text!r} is not ISO-8601 text"
        ) from None
    if parsed.tzinfo is None:
        raise OptionError(
            option,
            shown,
            ACCEPTED,
            reason=f"{prefix}{text!r} has no zone; add Z or an offset such as +01:00",
        )
    delta = parsed - datetime(1970, 1, 1, tzinfo=timezone.utc)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return math.ceil(micros / 1000)


def at_timestamp(ms: int) -> str:
    """The symbolic offset value "the first message at or after ``ms``"."""
    return f"{_PREFIX}{ms}"


def timestamp_of(value: str) -> int | None:
    """The instant of a symbolic value made by ``at_timestamp``; None for anything else."""
    if not value.startswith(_PREFIX):
        return None
    try:
        return int(value[len(_PREFIX) :])
    except ValueError:
        return None


def describe(ms: int) -> str:
    """``1700000000000 (2023-11-14T22:13:20Z)`` for messages."""
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    text = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{ms} ({text})"
