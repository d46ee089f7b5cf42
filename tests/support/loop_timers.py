"""Counting the timers a test's code arms on a real event loop (asyncio or uvloop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class TimerCount:
    """Counts ``loop.call_later`` calls (of callbacks named ``callback``, if given) while installed;
    the loop's own method does the work."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: str | None = None) -> None:
        self.loop = loop
        self.callback = callback
        self.armed = 0
        self._original = loop.call_later

    def __enter__(self) -> TimerCount:
        original = self._original

        def call_later(delay: float, callback: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            if self.callback in (None, getattr(callback, "__name__", "")):
                self.armed += 1
            return original(delay, callback, *args, **kw)

        self.loop.call_later = call_later  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.loop.call_later  # the loop's own method again
