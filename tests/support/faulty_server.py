"""Run ``durastream-server`` with disk faults injected from outside: slow fsync and ENOSPC.

``python -m tests.support.faulty_server --control <file.json> -- <durastream-server arguments>``
(``FaultyServerProcess`` is a ``ServerProcess`` that starts the server this way.)

The wrapper patches ``os`` in the server process before the server imports anything (no fault hooks in
production code), then runs the normal CLI. A daemon thread re-reads the control file every 50 ms; it
holds a JSON object (missing file or keys: no fault):

- ``"fsync_delay": <seconds>``: every ``fsync``/``fdatasync`` sleeps that long first (a slow disk).
- ``"enospc": true``: every ``pwritev``/``pwrite``/``write`` to a regular file fails with ENOSPC, after
  writing a torn part of the data for ``pwritev`` (as a real full disk can), while the flag is set.

``write_control`` is the other side, used by the soak (atomic replace, so the server never reads half).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

from tests.support.server_process import ServerProcess

POLL_SECONDS = 0.05


class _Control:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fsync_delay = 0.0
        self.enospc = False
        self.injected = {"slow_fsync": 0, "enospc": 0}

    def poll_forever(self) -> None:
        last = None
        while True:
            try:
                text = Path(self.path).read_text()
            except OSError:
                text = ""
            if text != last:
                last = text
                try:
                    data = json.loads(text) if text.strip() else {}
                except ValueError:
                    data = None  # a torn write of the control file: keep the old settings
                if isinstance(data, dict):
                    self.fsync_delay = float(data.get("fsync_delay") or 0.0)
                    self.enospc = bool(data.get("enospc"))
            time.sleep(POLL_SECONDS)


def _is_regular(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def install(control_path: str) -> _Control:
    control = _Control(control_path)
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    real_pwritev, real_pwrite, real_write = os.pwritev, os.pwrite, os.write

    def slow(real):  # noqa: ANN001, ANN202
        def synced(fd):  # noqa: ANN001, ANN202
            delay = control.fsync_delay
            if delay > 0:
                control.injected["slow_fsync"] += 1
                time.sleep(delay)
            return real(fd)

        return synced

    def full() -> OSError:
        control.injected["enospc"] += 1
        return OSError(errno.ENOSPC, "No space left on device (injected)")

    def pwritev(fd, buffers, offset, *args):  # noqa: ANN001, ANN202
        if control.enospc and _is_regular(fd):
            first = bytes(buffers[0]) if buffers else b""
            if len(first) > 1:
                real_pwrite(fd, first[: len(first) // 2], offset)  # torn
            raise full()
        return real_pwritev(fd, buffers, offset, *args)

    def pwrite(fd, data, offset):  # noqa: ANN001, ANN202
        if control.enospc and _is_regular(fd):
            raise full()
        return real_pwrite(fd, data, offset)

    def write(fd, data):  # noqa: ANN001, ANN202
        if control.enospc and fd > 2 and _is_regular(fd):
            raise full()
        return real_write(fd, data)

    os.fsync = slow(real_fsync)
    os.fdatasync = slow(real_fdatasync)
    os.pwritev = pwritev
    os.pwrite = pwrite
    os.write = write
    threading.Thread(target=control.poll_forever, name="fault-control", daemon=True).start()
    return control


def write_control(path: str | os.PathLike[str], **settings: object) -> None:
    """Atomically replace the control file with ``settings`` (e.g. ``fsync_delay=0.2``)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(settings))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--control":
        sys.stderr.write(
            "usage: python -m tests.support.faulty_server --control FILE -- SERVER-ARGS...\n"
        )
        return 2
    control_path = argv[1]
    rest = argv[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    install(control_path)
    from durastream_server.cli import main as server_main

    return server_main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


class FaultyServerProcess(ServerProcess):
    """``ServerProcess`` (start, SIGKILL, restart on the same data dir and port) through this wrapper,
    with the control file ``control_path``."""

    def __init__(self, data_dir: Path, control_path: Path, **settings: object) -> None:
        super().__init__(data_dir, **settings)  # type: ignore[arg-type]
        self.control_path = Path(control_path)

    def command(self, *, port: int | None = None) -> list[str]:
        args = super().command(port=port)  # [python, -m, durastream_server, *server args]
        repo = str(Path(__file__).resolve().parents[2])
        bootstrap = (
            f"import sys; sys.path.insert(0, {repo!r}); "
            "from tests.support.faulty_server import main; raise SystemExit(main(sys.argv[1:]))"
        )
        return [args[0], "-c", bootstrap, "--control", str(self.control_path), "--", *args[3:]]
