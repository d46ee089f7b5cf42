"""Pull-wake delivery (section 7.2): wake events on the wake stream, and claim request parsing.

A wake is announced by appending one event per pending stream to the subscription's ``wake_stream``, an
ordinary stream the application created. The events go through ``Engine.append`` like any other write,
so they are durable, ordered and readable with every live mode before the claim race starts.

Claims, acks and releases are transitions of ``state.Subscription``; this module only formats and parses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from durastream_server.engine.api import AppendRequest
from durastream_server.engine.engine import Engine
from durastream_server.subscriptions.errors import InvalidField
from durastream_server.subscriptions.model import parse_json_object
from durastream_server.subscriptions.state import Wake

log = logging.getLogger(__name__)

MAX_WORKER_LENGTH = 256


def wake_events(subscription_id: str, wake: Wake, now: float) -> list[dict[str, Any]]:
    pending = [item.path for item in wake.streams if item.has_pending]
    return [
        {
            "type": "wake",
            "subscription_id": subscription_id,
            "stream": path,
            "generation": wake.generation,
            "ts": int(now * 1000),
        }
        for path in pending or [item.path for item in wake.streams[:1]]
    ]


def encode_events(events: list[dict[str, Any]], content_type: str) -> bytes:
    """A JSON array for JSON streams (one message per event), else newline-delimited JSON."""
    if content_type.split(";", 1)[0].strip().lower() == "application/json":
        return json.dumps(events, separators=(",", ":")).encode("utf-8")
    return b"".join(
        json.dumps(event, separators=(",", ":")).encode("utf-8") + b"\n" for event in events
    )


class WakeStreamWriter:
    def __init__(self, engine: Engine, clock: Callable[[], float]) -> None:
        self._engine = engine
        self._clock = clock

    async def announce(self, subscription_id: str, wake_stream: str, wake: Wake) -> None:
        """Append the wake's events. Raises the engine's errors (e.g. the stream does not exist)."""
        info = self._engine.head(wake_stream)
        body = encode_events(wake_events(subscription_id, wake, self._clock()), info.content_type)
        await self._engine.append(
            AppendRequest(path=wake_stream, content_type=info.content_type, body=body)
        )


def parse_claim(body: bytes) -> str:
    """The worker name of a claim body ``{"worker": "..."}``."""
    data = parse_json_object(body)
    worker = data.get("worker")
    if not isinstance(worker, str) or not worker or len(worker) > MAX_WORKER_LENGTH:
        raise InvalidField(
            "worker", f"is required: a non-empty string of at most {MAX_WORKER_LENGTH} characters"
        )
    return worker
