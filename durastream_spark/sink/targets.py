"""Target streams: exist, have the sink's content type, and are open, before any data is sent to them.

Checked on the driver for a fixed ``stream`` option (so ``start()``/``save()`` fails early) and in each task
for every stream it routes rows to (a ``stream`` column names them only at run time). A ``HEAD`` decides:
another content type, or a closed stream, fails with an error naming the stream (and both types); a
missing stream is created with ``contentType`` when ``createStreams`` is true (``PUT`` is idempotent, so
tasks racing to create the same stream all succeed). On servers with ``bulk-write`` the targets a task
meets together (those of one input batch) are checked and created in one ``ensure`` request.

Routed writes on such servers remember what they ensured, per worker process (``query_targets``): a
streaming query's later batches, and later ``df.write`` jobs (``BATCH_JOBS``), do not ensure the same
streams again. A remembered target deleted since is answered 404 by the write and ensured again; one
closed or recreated with another content type since fails the write with the server's error for it
(naming the stream) instead of this module's.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable

from durastream_spark.errors import ContentTypeMismatch, StreamNotFound
from durastream_spark.protocol.bulk import BulkWrites
from durastream_spark.protocol.client import StreamClient
from durastream_spark.protocol.models import normalize_content_type
from durastream_spark.sink.errors import TargetClosed, TargetContentTypeMismatch, TargetMissing
from durastream_spark.sink.options import SinkOptions

log = logging.getLogger(__name__)

# Queries whose ensured targets a worker process remembers (the most recently used), and how many targets
# per query (past it the query's set starts afresh: one ensure of each again, never a wrong answer).
MAX_QUERIES = 16
MAX_TARGETS_PER_QUERY = 1_000_000

QueryKey = tuple[str, str, str]  # (server root URL, writer key or BATCH_JOBS, content type)
# The owner of the targets every df.write job of a worker process shares (a job's writer key is new
# each time; a streaming query's is its id, the same for all its batches).
BATCH_JOBS = "*df.write*"

_lock = threading.Lock()
_queries: OrderedDict[QueryKey, set[str]] = OrderedDict()


def query_targets(key: QueryKey) -> set[str]:
    """The targets this process has ensured for the query ``key`` (shared, mutable: ``TargetStreams``
    adds what it ensures). Bounded: ``MAX_QUERIES`` queries, ``MAX_TARGETS_PER_QUERY`` targets each."""
    with _lock:
        known = _queries.get(key)
        if known is None or len(known) > MAX_TARGETS_PER_QUERY:
            known = _queries[key] = set()
        _queries.move_to_end(key)
        while len(_queries) > MAX_QUERIES:
            _queries.popitem(last=False)
        return known


def forget_query(key: QueryKey) -> None:
    """After a 404 that was not repaired in place: the query's targets are ensured again."""
    with _lock:
        _queries.pop(key, None)


class TargetStreams:
    """Checks (and creates) each target once per instance; instances live for one task or one planning.
    With ``known`` (``query_targets``), also once per query in this process."""

    def __init__(
        self, client: StreamClient, options: SinkOptions, known: set[str] | None = None
    ) -> None:
        self._client = client
        self._options = options
        self._ready: set[str] = known if known is not None else set()

    def refresh(self, paths: Iterable[str]) -> None:
        """Ensure ``paths`` again, whatever was known of them (a write to them was answered 404)."""
        paths = list(dict.fromkeys(paths))
        self._ready.difference_update(paths)
        log.info("ensuring %d target stream(s) again: a write found them missing", len(paths))
        self.ensure_all(paths)

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
            self._check(path, meta.content_type, meta.closed, meta.next_offset)
        self._ready.add(path)

    def ensure_all(self, paths: Iterable[str]) -> None:
        """``ensure`` for each of ``paths``; on ``bulk-write`` servers the new ones in one request
        (a task routing to 2,000 streams made 2,000 ``HEAD`` and ``PUT`` requests)."""
        new = [path for path in dict.fromkeys(paths) if path not in self._ready]
        if not new:
            return
        bulk = BulkWrites(self._client, self._options.content_type)
        if len(new) == 1 or not bulk.supported():
            for path in new:
                self.ensure(path)
            return
        wanted = self._options.content_type
        for path, found in zip(
            new, bulk.ensure(new, create=self._options.create_streams), strict=True
        ):
            if isinstance(found, StreamNotFound):
                raise TargetMissing(path) from found
            if isinstance(found, ContentTypeMismatch):
                raise TargetContentTypeMismatch(
                    path, found.existing or "(another type)", wanted
                ) from found
            if isinstance(found, Exception):
                raise found
            if found.created:
                log.info("created stream '%s' (%s)", path, wanted)
            self._check(path, found.content_type, found.closed, found.next_offset)
            self._ready.add(path)

    def _check(self, path: str, content_type: str, closed: bool, next_offset: str | None) -> None:
        """An existing target: the sink's content type, and open."""
        wanted = self._options.content_type
        if normalize_content_type(content_type) != normalize_content_type(wanted):
            raise TargetContentTypeMismatch(path, content_type, wanted)
        if closed:
            raise TargetClosed(path, next_offset)
