"""Errors the sink raises itself (protocol errors from the client keep their own types from ``errors.py``).

Each one says what happened to which stream, batch and partition, and what the user can do about it. They
are ``DurastreamError``s, so they pickle across Spark's process boundaries like every connector error.
"""

from __future__ import annotations

from durastream_spark.errors import DurastreamError


class SinkError(DurastreamError):
    """Base class of errors raised by the durastream sink."""


class UnsupportedWrite(SinkError, ValueError):
    """The DataFrame or the save mode cannot be written (checked on the driver, before any task runs)."""


class TargetStreamError(SinkError):
    """A target stream cannot take this write: missing, closed, or of another content type."""

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


class TargetContentTypeMismatch(TargetStreamError):
    """The target exists with another content type. ``existing`` and ``requested`` name both."""

    def __init__(self, stream: str, existing: str, requested: str) -> None:
        super().__init__(
            f"Target stream '{stream}' already exists with content type '{existing}', but the sink writes "
            f"'{requested}' (option 'contentType'). Nothing was sent. Set contentType to '{existing}' or "
            "write to another stream.",
            stream=stream,
        )
        self.existing = existing
        self.requested = requested


class TargetClosed(TargetStreamError):
    """The target stream is closed: it accepts no more appends, ever."""

    def __init__(self, stream: str, final_offset: str | None) -> None:
        super().__init__(
            f"Target stream '{stream}' is closed (final offset {final_offset}) and accepts no more appends. "
            "Write to another stream.",
            stream=stream,
        )
        self.final_offset = final_offset


class TargetMissing(TargetStreamError):
    """The target does not exist and ``createStreams`` is false."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"Target stream '{stream}' does not exist and option 'createStreams' is false. Create the "
            "stream first, or set createStreams=true.",
            stream=stream,
        )


class TaskIdentityError(SinkError):
    """Spark did not say which query, batch or partition a task belongs to; exactly-once needs all three."""


class ReorderedRetryError(SinkError):
    """Ordered mode: a retry sent different bytes under a (producer, epoch, seq) tuple already used.

    The server kept the first payload and refused this one (payload digests), so nothing was lost or
    duplicated silently; the write fails instead.
    """


class CommitError(SinkError):
    """The driver could not commit a batch; the message lists every (stream, partition) that failed.

    ``failures`` holds each failed part's own error, first failure first: the Spark boundary drops the
    exception chain (``boundary.py``), so code that must tell a fenced commit (``StaleEpochError``) from an
    unreachable server looks here rather than at ``__cause__``.
    """

    def __init__(self, message: str, *, failures: tuple[BaseException, ...] = ()) -> None:
        super().__init__(message)
        self.failures = failures


class ProducerStateLost(SinkError):
    """The server reports a sequence gap that no request of this writer explains."""


class InvalidPayload(SinkError):
    """The server refused a request body as invalid: for JSON streams, a ``value`` that is not JSON."""
