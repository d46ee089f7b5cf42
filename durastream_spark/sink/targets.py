"""Target streams: exist, have the sink's content type, and are open, before any data is sent to them.

Checked on the driver for a fixed ``stream`` option (so ``start()``/``save()`` fails early) and in each task
for every stream it routes rows to (a ``stream`` column names them only at run time). A ``HEAD`` decides:
another content type, or a closed stream, fails with an error naming the stream (and both types); a
missing stream is created with ``contentType`` when ``createStreams`` is true (``PUT`` is idempotent, so
tasks racing to create the same stream all succeed).
"""

from __future__ import annotations

import logging

from durastream_spark.errors import ContentTypeMismatch, StreamNotFound
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import normalize_content_type
from durastream_spark.sink.errors import TargetClosed, TargetContentTypeMismatch, TargetMissing
from durastream_spark.sink.options import SinkOptions

log = logging.getLogger(__name__)


class TargetStreams:
    """Checks (and creates) each target once per instance; instances live for one task or one planning."""

    def __init__(self, client: StreamClient, options: SinkOptions) -> None:
        self._client = client
        self._options = options
        self._ready: set[str] = set()

    def ensure(self, path: str) -> None:
        if path in self._ready:
            return
        wanted = self._options.content_type
        try:
            meta = self._client.head(path)
        except StreamNotFound:
            if not self._options.create_streams:
                raise TargetMissing(path) from None
            try:
                created = self._client.create(path, wanted)
            except ContentTypeMismatch as race:  # created concurrently with another type
                raise TargetContentTypeMismatch(
                    path, race.existing or "(another type)", wanted
                ) from race
            if created.created:
                log.info("created stream '%s' (%s)", path, wanted)
            if created.closed:
                raise TargetClosed(path, created.next_offset) from None
        else:
            if normalize_content_type(meta.content_type) != normalize_content_type(wanted):
                raise TargetContentTypeMismatch(path, meta.content_type, wanted)
            if meta.closed:
                raise TargetClosed(path, meta.next_offset)
        self._ready.add(path)
