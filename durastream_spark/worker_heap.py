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
