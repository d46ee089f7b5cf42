"""``freeze_startup_heap``: once per process, and only what is alive at that moment is frozen.

Run in a child interpreter: freezing is process-wide, and the test process should stay as it is.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc
    from durastream_spark.worker_heap import freeze_startup_heap

    assert gc.get_freeze_count() == 0
    freeze_startup_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 1000, frozen  # the imported modules' objects

    class Cycle:
        pass

    later = Cycle()
    later.me = later  # created after the freeze: still collected
    del later
    assert gc.collect() >= 1

    freeze_startup_heap()  # the second task in the same worker
    assert gc.get_freeze_count() == frozen
    print("ok")
    """
)


def test_freezes_once_and_later_garbage_is_still_collected() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_collector_is_held_while_planning_and_restored_after() -> None:
    """``collections_held``: no automatic collection inside, nested and concurrent holds counted,
    and the collector left as the first hold found it (enabled, or disabled by the caller), also
    when the planning raises."""
    import gc
    import threading

    from durastream_spark.worker_heap import collections_held

    assert gc.isenabled()
    inside = threading.Event()
    leave = threading.Event()

    def other_planner() -> None:
        with collections_held():
            inside.set()
            leave.wait(timeout=30)

    with collections_held():
        assert not gc.isenabled()
        planner = threading.Thread(target=other_planner)
        planner.start()
        assert inside.wait(timeout=30)
        with collections_held():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other planner still holds it
    leave.set()
    planner.join(timeout=30)
    assert gc.isenabled()

    try:
        with collections_held():
            raise ValueError("planning failed")
    except ValueError:
        pass
    assert gc.isenabled()

    gc.disable()
    try:
        with collections_held():
            pass
        assert not gc.isenabled()  # the caller's choice is kept
    finally:
        gc.enable()
