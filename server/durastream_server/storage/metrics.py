"""What the storage layer reports about its writes: the narrow interface between the group commit and
whatever counts it (``durastream_server.metrics`` in the server; nothing in tests and tools).

The writer calls it from its worker threads, once per batch and once per ``fdatasync``, never per request,
so an implementation may take a lock. Storage only knows this protocol, never the metrics library.
"""

from __future__ import annotations

from typing import Final, Protocol


class WriteMetrics(Protocol):
    """Receives one call per written batch and one per ``fdatasync``. Must be thread-safe."""

    def batch(self, records: int, messages: int, payload_bytes: int) -> None:
        """A batch of ``records`` log records holding ``messages`` messages and ``payload_bytes`` bytes
        of payload was written (one group commit)."""

    def fsync(self, seconds: float) -> None:
        """One ``fdatasync`` of a segment took ``seconds``."""


class _NoMetrics:
    """Counts nothing (tools, tests, embedded servers without a metrics endpoint)."""

    __slots__ = ()

    def batch(self, records: int, messages: int, payload_bytes: int) -> None:
        pass

    def fsync(self, seconds: float) -> None:
        pass


NO_METRICS: Final[WriteMetrics] = _NoMetrics()
