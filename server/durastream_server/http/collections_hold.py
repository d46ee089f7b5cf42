"""The cyclic GC while bulk requests are in flight: fewer, larger young collections (issue 16).

A bulk ``ensure`` or ``commits`` request of N entries keeps every entry's objects alive until it is
answered (the parsed entries, the engine's futures, the ``AppendEntry`` records, the answers), and a
routed write's new streams add dozens of long-lived objects each. With the interpreter's default
young-generation threshold (700 net allocations) such a request sets off a young collection every few
entries, and those survivors climb into the old generation, whose full collections rescan all of them:
measured in process (``bench/engine_create_cpu.py --bulk 10000 --packed-appends``, the heap frozen as the
server freezes it), the cyclic GC was 22 us of an ``ensure`` entry's ~95 us of loop CPU and 61-80 us of
an inline commit's ~195 us, none of it finding garbage worth the scan (docs/benchmarks.md, "Run 8").

So while at least one bulk request is in flight, the young threshold is ``BULK_YOUNG_THRESHOLD``
(the older generations' thresholds are kept); the first request to start raises it, the last to end
puts the previous thresholds back. Collections still run (garbage stays bounded by the threshold), they
are just rarer, and each young one scans more objects (well under a millisecond at this size). Outside
bulk requests the serving threshold holds (``SERVING_YOUNG_THRESHOLD``, set by ``start_serving``: 2,000,
kept small for the latency of small requests, decision 0004), and a bulk request's own answer takes far
longer than such a pause.

On since 2026-11-28 (session h35): re-measured in alternating pairs, it cut the routed save of 100,000
rows to 10,000 new streams to 0.83x the server CPU (packed appends, the default), and the regression
seen once without packed appends (h29) did not reproduce: that layout's routed save varies by 1.7x
between runs of the same code, and the pairs with and without the hold were within it
(docs/benchmarks.md, sink section, Run 9).
Raised from 10,000 to 50,000 (session h64): a ``commits`` request of 1,000 two-part entries still
made 17-27 young collections per 20,000 parts, 6-14 us of a part's ~25 us of loop CPU in process;
at 50,000, 2.4-5.4 us (docs/benchmarks.md, sink section, Run 17: about half of that run's 0.85x).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

BULK_YOUNG_THRESHOLD: Final = 50_000
# The young threshold once the server listens (``server.py``, after its ``gc.freeze()``): about 64
# small appends in flight keep their objects alive across a commit round, so at the interpreter's 700
# a young collection ran every ~55 requests and found nothing (docs/benchmarks.md, h66-leanrequest).
SERVING_YOUNG_THRESHOLD: Final = 2_000


def start_serving() -> None:
    """Once the server listens: what exists now (modules, the app, recovered streams) lives as long
    as the server, so it is moved out of the cyclic GC's reach (``gc.freeze``: a full collection then
    scans only what requests created; unfrozen, one took ~20 ms in the middle of a commit that woke
    100 long-polls, docs/decisions/0004-performance.md), and the young threshold becomes
    ``SERVING_YOUNG_THRESHOLD`` (unless collections are off)."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < SERVING_YOUNG_THRESHOLD:
        gc.set_threshold(SERVING_YOUNG_THRESHOLD, middle, old)


class BulkCollections:
    """Counts the bulk requests in flight and holds the raised threshold while there is one."""

    __slots__ = ("_depth", "_saved", "enabled")

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled  # False: holds are only counted, the thresholds are left alone
        self._depth = 0
        self._saved: tuple[int, int, int] | None = None

    @property
    def depth(self) -> int:
        """Bulk requests in flight (tests, observability)."""
        return self._depth

    @contextmanager
    def held(self) -> Iterator[None]:
        """Run the body with the bulk threshold (nested and concurrent holds share one raise)."""
        if self._depth == 0 and self.enabled:
            saved = gc.get_threshold()
            self._saved = saved
            if saved[0] and saved[0] < BULK_YOUNG_THRESHOLD:  # 0: collections are off, keep it so
                gc.set_threshold(BULK_YOUNG_THRESHOLD, saved[1], saved[2])
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._saved is not None:
                gc.set_threshold(*self._saved)
                self._saved = None


# One per process: the thresholds are the interpreter's.
BULK = BulkCollections()
