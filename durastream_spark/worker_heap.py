"""Keep the full garbage collection that PySpark runs after every task cheap in our Python workers.

PySpark reuses a Python worker for many tasks and runs ``gc.collect()`` after each one. A full collection
walks every tracked object: in a worker that has imported pyspark, pyarrow and requests that is about
87,000 objects and 25-70 ms per task, measured on the source benchmark (a tenth of the workers' CPU at
four tasks per read). Nearly all of those objects are modules, classes and functions that live as long as
the process. ``gc.freeze()`` moves them to the permanent generation, so later collections walk only what
tasks created since: about a millisecond.

Done once per process, at the start of its first durastream task, after one last full collection (so no
garbage is frozen). Objects created later are collected as usual; the cost is that garbage cycles among
the objects alive at that moment are never reclaimed, which for import-time objects is what happens anyway.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_frozen = False


def freeze_startup_heap() -> None:
    """Move the objects alive now to the collector's permanent generation, once per process."""
    global _frozen
    if _frozen:
        return
    with _lock:
        if _frozen:
            return
        gc.collect()
        gc.freeze()
        _frozen = True


_held = 0  # planning calls inside ``collections_held`` right now (threads of one process)
_held_lock = threading.Lock()
_resume = False  # whether the collector was enabled when the first of them started


@contextmanager
def collections_held() -> Iterator[None]:
    """No automatic collection while the driver plans a batch (the collector is enabled again after).

    Planning a batch over 10,000 streams made ~50,000 small tuples that all stay alive until the
    plan is returned (a ``StreamState``, ``StreamRange``, ``RangeSize``, ``Piece`` and ``Segment`` a
    stream; a batch read of small streams now plans from columns, a ``StreamRange`` a stream): each young collection walks the survivors again, and the older generations' collections
    walk the whole heap of the planning process. Measured for 10,000 streams: in Spark's planning
    worker 0.045 -> 0.040 s CPU; in a plain Python process driving the reader API (the fan-out
    benchmark's scratch driver) 0.095 -> 0.037 s (why the two differ was not found). The planning
    makes no garbage cycles worth collecting early, and whatever it leaves is collected at the next automatic collection after the hold. Nested and
    concurrent holds are counted; the last to leave restores the collector as the first found it.
    """
    global _held, _resume
    with _held_lock:
        if _held == 0:
            _resume = gc.isenabled()
            gc.disable()
        _held += 1
    try:
        yield
    finally:
        with _held_lock:
            _held -= 1
            if _held == 0 and _resume:
                gc.enable()
