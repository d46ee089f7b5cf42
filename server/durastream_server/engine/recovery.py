"""Recovery after the server listens: in the background, and first for the paths requests name.

With 100,000 streams, recovering every one before serving took most of a minute (a few hundred
microseconds of CPU and a dozen system calls per stream). The data directory now opens with every stream
*pending* (``storage/pending.py``: grouped into units, a path's incarnations with their fork sources and
forks), and this module recovers them:

- in the background, oldest units first, a few batches of a few hundred streams in flight on the I/O
  pool (each batch is one task there, as start-up did), the loop free between them;
- at once, ahead of the background, for the unit of a path a request names (``prepare``): a read,
  append, HEAD, create or delete of a stream not recovered yet waits for that one unit, never for the
  rest. A unit the background already took is waited for, never recovered twice.

Never serving wrong data: a path's unit is registered in one step on the loop (``Engine._adopt``), with
everything a request for it consults (state, fork graph, staged appends); what needs every stream at once
(listing, the change feed, subscriptions, staged-append requests) waits for ``done``. ``/metrics`` does
not: it counts what is recovered so far and says how many streams are pending (``census.py``).
A header that disagrees with the catalog's hint (``storage/catalog.py``) means the hints cannot be trusted:
from then on ``prepare`` waits for ``done`` as well, and the catalog is corrected. (A request for the
header's real path that comes before that directory is recovered is answered from the hints: the catalog's
lines are checksummed and written only from headers, so a hint that is wrong and well-formed takes a bug
or a hand edit.)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable

from durastream_server import allocator
from durastream_server.storage import DataDir
from durastream_server.storage.log import StreamLog

logger = logging.getLogger(__name__)

BATCH_STREAMS = 256  # streams per task on the I/O pool
IN_FLIGHT = 4  # batches recovering at once


class Recovery:
    """Recovers ``data.pending`` and hands each unit's logs to ``adopt`` (the engine registers them)."""

    def __init__(
        self,
        data: DataDir,
        adopt: Callable[[list[StreamLog]], Awaitable[None]],
        finish: Callable[[], Awaitable[None]],
    ) -> None:
        self._data = data
        self._pending = data.pending
        self._adopt = adopt
        self._finish = finish  # run once every unit is in, before ``done`` is set
        self.done = asyncio.Event()
        self.trusted = True  # the catalog's hints agree with every header seen so far
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        """Not every stream is in yet: recovery runs, or a unit of it failed (its path's requests
        then get that failure again, never a "does not exist")."""
        return not self.done.is_set() or self._pending.streams > 0

    @property
    def remaining(self) -> int:
        """Stream directories not recovered yet."""
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="durastream-recovery")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def prepare(self, path: str) -> None:
        """Return once every incarnation of ``path`` that exists on disk is recovered and registered."""
        if not self.active:
            return
        if not self.trusted:
            await self.done.wait()
        key = self._pending.unit_of(path)
        if key is not None:
            await asyncio.shield(self._pending.taken.get(key) or self._take([key]))

    def _take(self, keys: list[str]) -> asyncio.Future[None]:
        """Start recovering the units ``keys`` (none of them taken yet) as one task."""
        task = asyncio.ensure_future(self._recover(keys))
        taken = self._pending.taken
        for key in keys:
            taken[key] = task
        return task

    async def _recover(self, keys: list[str]) -> None:
        pending = self._pending
        ids = [storage_id for key in keys for storage_id in pending.ids(key)]
        logs = await self._data.recover(ids)
        self._check_hints(logs)
        await self._adopt(logs)
        # Only now: a unit whose recovery failed (the I/O pool gone at shutdown, a bug) stays pending,
        # and a request for its path gets the failure, never a "does not exist".
        for key in keys:
            pending.recovered(key)

    def _check_hints(self, logs: list[StreamLog]) -> None:
        hints = self._pending.hints
        for log in logs:
            hint = hints.get(log.id)
            header = log.header
            if hint is not None and (
                hint.path != header.path or hint.source_id != header.fork_source_id
            ):
                self._data.correct_catalog(log.id, header.path, header.fork_source_id)
                if self.trusted:
                    logger.error(
                        "stream %s: the catalog names path %r (fork of %s), its header %r (fork of "
                        "%s); until recovery is complete, every request waits for it",
                        log.id,
                        hint.path,
                        hint.source_id,
                        header.path,
                        header.fork_source_id,
                    )
                self.trusted = False

    async def _run(self) -> None:
        # As at start-up (server.py): recovery allocates long-lived objects, which the cyclic GC
        # would only re-scan; collected and frozen once everything is in.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            await self._recover_all()
        finally:
            if was_enabled:
                gc.enable()
                gc.freeze()
        # What recovery freed (file buffers, batch lists, decoded records) sits in the malloc heaps
        # between and above what it kept: hand it back, off the loop (allocator.py; issue 17).
        await asyncio.get_running_loop().run_in_executor(
            self._data.read_executor, allocator.release_free_memory
        )

    async def _recover_all(self) -> None:
        try:
            pending = self._pending
            in_flight: set[asyncio.Future[None]] = set()
            batch: list[str] = []
            size = 0
            for key in pending.unit_keys():
                if key in pending.taken:
                    continue  # a request took it first
                batch.append(key)
                size += len(pending.groups.get(key, ())) or 1
                if size < BATCH_STREAMS:
                    continue
                in_flight.add(self._take(batch))
                batch, size = [], 0
                if len(in_flight) >= IN_FLIGHT:
                    _, in_flight = await asyncio.wait(
                        in_flight, return_when=asyncio.FIRST_COMPLETED
                    )
            if batch:
                in_flight.add(self._take(batch))
            # Units requests took are awaited too: ``done`` means every stream is registered.
            results = await asyncio.gather(*set(pending.taken.values()), return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    logger.error("recovery of a batch of streams failed: %r", result)
            if not pending.streams:
                pending.clear()
            await self._finish()
        except Exception:  # not CancelledError: a server closing during recovery never finishes it
            logger.exception("background recovery failed")
        self.done.set()
