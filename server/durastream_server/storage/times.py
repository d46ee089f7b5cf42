"""Time lookups from record headers: the first message whose append time reached an instant.

Every APPEND record header carries its append time, and the sparse index stores the *effective* append
time of each of its points (the running maximum, ``index.py``). Effective times never decrease, so the
first message at or after an instant lies between the last point below it and the next point: a bisect,
then a header scan of about one index interval. No payload is read.

The scan blocks (``pread``), so ``StreamLog`` runs it in its read executor.
"""

from __future__ import annotations

from durastream_server.storage.files import FdCache
from durastream_server.storage.segments import ReadView, iter_appends


def first_at_or_after(
    segs: ReadView, cache: FdCache, offset: int, running_ms: int, at_ms: int
) -> tuple[int, int] | None:
    """``(position, append time)`` of the first record with messages whose effective append time is
    ``>= at_ms``, scanning record headers from global ``offset`` (a record start whose effective time,
    ``running_ms``, is below ``at_ms``) to the end of the view; None if there is none.

    The time returned is the record's own append time (all its messages share it).
    """
    with segs.window(cache) as window:
        for ref in iter_appends(window, offset, segs.end):
            if not ref.n_messages:
                continue  # a close-only record or a group's header: no message carries its time
            if ref.timestamp_ms > running_ms:
                running_ms = ref.timestamp_ms
            if running_ms >= at_ms:
                return ref.position, ref.timestamp_ms
    return None
