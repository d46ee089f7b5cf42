"""Small helpers shared by tests that talk to a real server over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def sse_events(text: str) -> list[tuple[str, str]]:
    """Spec-following SSE parse: every CR, LF or CRLF ends a line; one optional space after 'data:'."""
    events, kind, data = [], "", []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if kind:
                events.append((kind, "\n".join(data)))
            kind, data = "", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if kind:
        events.append((kind, "\n".join(data)))
    return events
