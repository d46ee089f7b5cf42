"""Counters the server keeps while it serves: plain integers, bumped on the event loop.

Why not ``prometheus_client``'s own ``Counter``/``Histogram`` on the hot path: each of their updates takes
a ``threading.Lock`` and, with labels, a dictionary look-up of a label tuple built per call; every request
would pay that several times. Here a request costs a few integer additions, one ``bisect`` into a tuple of
bucket bounds and one float addition, with no allocation of its own (measured in docs/server.md,
"Metrics"). Everything the HTTP layer counts happens on the one event loop thread, so no lock is needed;
the storage writer reports from its worker threads, once per batch and per fsync, and takes ``_lock``.

The figures become Prometheus metric families only when ``/metrics`` is scraped (``exposition.py``).
Labels are bounded by construction: a route class (a fixed set, below), a status code (what the server
sends), an operation. No label ever carries a stream path.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable
from typing import Final

# Route classes: the ``route`` label of ``durastream_http_requests_total``. A fixed set, so the label's
# cardinality is bounded whatever clients send.
ROUTES: Final = (
    "append",  # POST to a stream: append and/or close
    "stage",  # POST with Durastream-Txn (staged append)
    "commit",  # POST with Durastream-Commit
    "abort",  # POST with Durastream-Abort
    "create",  # PUT
    "delete",  # DELETE
    "head",  # HEAD of a stream
    "read",  # GET catch-up read, and the read extensions (end=, format=, lookup=)
    "long_poll",  # GET live=long-poll
    "sse",  # GET live=sse
    "discovery",  # __ds/x-durastream/{extensions,streams}
    "subscriptions",  # other __ds/ routes (section 6-7)
    "health",  # /healthz
    "metrics",  # /metrics
    "other",  # anything else: unknown paths, malformed requests, CORS preflights
)
# Routes with a latency histogram (``durastream_request_duration_seconds{route=...}``).
LATENCY_ROUTES: Final = ("append", "read", "commit")

# Seconds: from 100 us (an append without fsync) to 10 s.
LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
# Records per group-commit batch: 1 (no grouping) to thousands.
BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Histogram:
    """A fixed-bucket histogram: ``counts[i]`` observations in ``(bounds[i-1], bounds[i]]``, the last
    slot above every bound. Not thread-safe by itself."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, count: int) -> None:
        """``count`` observations of the same ``value`` (one wake-up answering many long-polls)."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, ``inf`` last (Prometheus' ``le``)."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class ServerMetrics:
    """Everything counted while serving. One per server; the HTTP layer updates it on the loop, the
    storage writer through the ``WriteMetrics`` methods (``batch``, ``fsync``) from worker threads."""

    def __init__(self) -> None:
        # route -> status code -> requests
        self.requests: dict[str, dict[int, int]] = {route: {} for route in ROUTES}
        self.latency: dict[str, Histogram] = {
            route: Histogram(LATENCY_BUCKETS) for route in LATENCY_ROUTES
        }
        self.long_poll_wake = Histogram(LATENCY_BUCKETS)
        self.request_bytes = 0  # request bodies received
        self.response_bytes = 0  # response bodies sent
        self.messages_read = 0  # messages in read responses (catch-up, long-poll, SSE, frames)
        self.open_long_polls = 0
        self.open_sse = 0
        # Written by the storage writer's threads (under the lock).
        self._lock = threading.Lock()
        self.batch_records = Histogram(BATCH_BUCKETS)
        self.fsync_seconds = Histogram(LATENCY_BUCKETS)
        self.messages_written = 0
        self.payload_bytes_written = 0

    # -- the HTTP layer, on the loop ---------------------------------------------------------------

    def finished(self, route: str, status: int, seconds: float) -> None:
        """One request of ``route`` answered ``status`` after ``seconds``."""
        by_status = self.requests[route]
        by_status[status] = by_status.get(status, 0) + 1
        histogram = self.latency.get(route)
        if histogram is not None:
            histogram.observe(seconds)

    # -- storage (WriteMetrics), from worker threads -----------------------------------------------

    def batch(self, records: int, messages: int, payload_bytes: int) -> None:
        with self._lock:
            self.batch_records.observe(records)
            self.messages_written += messages
            self.payload_bytes_written += payload_bytes

    def fsync(self, seconds: float) -> None:
        with self._lock:
            self.fsync_seconds.observe(seconds)

    def write_side(self) -> tuple[Histogram, Histogram, int, int]:
        """Copies of the writer's figures, taken under the lock (for a scrape)."""
        with self._lock:
            return (
                _copy(self.batch_records),
                _copy(self.fsync_seconds),
                self.messages_written,
                self.payload_bytes_written,
            )


def _copy(histogram: Histogram) -> Histogram:
    copy = Histogram(histogram.bounds)
    copy.counts = list(histogram.counts)
    copy.sum = histogram.sum
    return copy
