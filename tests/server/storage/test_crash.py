"""SIGKILL a process that appends through the storage layer, then recover and check the log.

The child appends with group commit (several concurrent stagers, small segments, frequent snapshots) and
reports each acknowledged append on stdout. After the kill, every acknowledged message must be in the log,
in order, exactly once; nothing else may appear but unacknowledged messages; and new appends must work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from durastream_server.storage import AlreadyLocked

from ._util import append, open_dd, read_all, run

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from durastream_server.storage import (
        AppendEntry, DataDir, ProducerTuple, StorageConfig, StreamHeader,
    )

    async def main(root):
        dd = await DataDir.open(StorageConfig(
            root=Path(root), segment_bytes=16 * 1024, index_interval_bytes=1024,
            snapshot_interval_entries=50,
        ))
        if dd.logs:
            (log,) = dd.logs.values()
        else:
            log = await dd.create_stream(
                StreamHeader(path="/crash", content_type="application/json", created_at_ms=1), None
            )
        start = log.state.entries

        async def writer(w):
            i = 0
            while True:
                body = b'{"r":%d,"w":%d,"i":%d,"pad":"%s"}' % (start, w, i, b"x" * (i % 97))
                e = AppendEntry(log.state.tail, (body,), 1, producer=ProducerTuple(f"w{w}", start, i))
                await log.stage(e)
                sys.stdout.write(body.decode() + "\\n")
                sys.stdout.flush()
                i += 1

        await asyncio.gather(*(writer(w) for w in range(6)))

    asyncio.run(main(sys.argv[1]))
    """
)


def _run_and_kill(root: Path, acks_before_kill: int) -> list[bytes]:
    env = dict(os.environ)
    server_dir = str(Path(__file__).resolve().parents[3] / "server")
    env["PYTHONPATH"] = server_dir + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root)], stdout=subprocess.PIPE, env=env
    )
    acked: list[bytes] = []
    try:
        assert child.stdout is not None
        while len(acked) < acks_before_kill:
            line = child.stdout.readline()
            assert line, f"child exited early with {child.wait()}"
            acked.append(line.rstrip(b"\n"))
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:  # acks already in the pipe were acknowledged too
            acked.append(line.rstrip(b"\n"))
    finally:
        child.kill()
        child.wait()
    return acked


def test_sigkill_mid_append_then_recover(tmp_path: Path) -> None:
    all_acked: list[bytes] = []
    for round_ in range(3):
        acked = _run_and_kill(tmp_path, 400 + 150 * round_)
        all_acked.extend(acked)

        async def check() -> None:
            dd = await open_dd(tmp_path, segment_bytes=16 * 1024)
            assert dd.corrupt == {}
            (log,) = dd.logs.values()
            messages = await read_all(log)
            assert len(messages) == len(set(messages))  # exactly once
            present = set(messages)
            assert all(m in present for m in all_acked)  # nothing acknowledged was lost
            # Per writer, messages appear in order (group commit preserves staging order).
            rank = {m: i for i, m in enumerate(all_acked)}
            order = [m for m in messages if m in rank]
            assert order == sorted(order, key=rank.__getitem__)
            assert log.state.tail == sum(len(m) for m in messages)
            await dd.close()

        run(check)

    async def still_appendable() -> None:
        dd = await open_dd(tmp_path, segment_bytes=16 * 1024)
        (log,) = dd.logs.values()
        await append(log, b'"after"')
        assert (await read_all(log))[-1] == b'"after"'
        await dd.close()

    run(still_appendable)


def test_a_second_process_cannot_open_a_locked_data_dir(tmp_path: Path) -> None:
    """Hazard 24: the lock is an flock on LOCK, so it holds across processes, not just in one."""
    holder = textwrap.dedent(
        """
        import asyncio, sys
        from pathlib import Path
        from durastream_server.storage import DataDir, StorageConfig

        async def main():
            dd = await DataDir.open(StorageConfig(root=Path(sys.argv[1])))
            print("locked", flush=True)
            sys.stdin.readline()
            await dd.close()

        asyncio.run(main())
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3] / "server")
    child = subprocess.Popen(
        [sys.executable, "-c", holder, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"locked\n"

        async def try_open() -> None:
            with pytest.raises(AlreadyLocked):
                await open_dd(tmp_path)

        run(try_open)
    finally:
        child.communicate(b"\n", timeout=30)
    assert child.returncode == 0

    async def now_free() -> None:
        dd = await open_dd(tmp_path)
        await dd.close()

    run(now_free)
