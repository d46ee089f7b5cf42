"""Server-generated cursors for CDN collapsing (section 10.1).

Time is cut into 20-second intervals counted from 2024-10-09T00:00:00Z; the cursor is the interval number.
A client that echoes a cursor at or beyond the current interval gets a strictly larger one (plus 1-3600 s of
random jitter, in whole intervals), so cursors never repeat for a client and a CDN cannot loop it on a cached
empty response.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Final

CURSOR_EPOCH: Final = datetime(2024, 10, 9, tzinfo=timezone.utc).timestamp()
INTERVAL_SECONDS: Final = 20
MAX_JITTER_SECONDS: Final = 3600
_MAX_CURSOR_DIGITS: Final = 20


def current_interval(now: float) -> int:
    return max(0, int((now - CURSOR_EPOCH) // INTERVAL_SECONDS))


def next_cursor(
    client_cursor: str | None,
    *,
    clock: Callable[[], float] = time.time,
    rng: random.Random | None = None,
) -> str:
    """The cursor for a live response, given the one the client echoed (if any)."""
    interval = current_interval(clock())
    client = _parse(client_cursor)
    if client is None or client < interval:
        return str(interval)
    jitter_seconds = (rng or random).randint(1, MAX_JITTER_SECONDS)
    return str(client + max(1, round(jitter_seconds / INTERVAL_SECONDS)))


def _parse(text: str | None) -> int | None:
    """A client cursor is only trusted when it is a plain, bounded decimal; anything else is ignored."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > _MAX_CURSOR_DIGITS:
        return None
    return int(text)
