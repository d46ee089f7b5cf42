"""Fault injection for ``tests/server/workers/test_forks.py`` (a mock only to inject a fault): pause
a fork's placement at its home, in a server started with this directory on ``PYTHONPATH`` and
``DURASTREAM_TEST_PLACEMENT_PAUSE`` naming a control directory.

Every worker imports this at start (``sitecustomize``) and wraps ``shards.forks._write``, the
durable write of the placement table: before it (or after it, when the control directory holds
``after``), the writing thread creates ``paused-<pid>`` there and waits until ``release`` exists, so
a test can race another request, or SIGKILL the worker, at exactly that point. Nothing waits once
``release`` exists (a restarted worker is not paused again)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_CONTROL = os.environ.get("DURASTREAM_TEST_PLACEMENT_PAUSE")
_LONGEST_SECONDS = 60.0  # a test that never releases fails on its own deadline first


def _pause(control: Path) -> None:
    if (control / "release").exists():
        return
    (control / f"paused-{os.getpid()}").touch()
    deadline = time.monotonic() + _LONGEST_SECONDS
    while not (control / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


if _CONTROL:
    from durastream_server.shards import forks

    _write = forks._write

    def _paused_write(path: Path, placements: dict[str, int]) -> None:
        control = Path(_CONTROL)
        after = (control / "after").exists()
        if not after:
            _pause(control)
        _write(path, placements)
        if after:
            _pause(control)

    forks._write = _paused_write
