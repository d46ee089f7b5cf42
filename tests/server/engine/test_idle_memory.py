"""Memory of idle streams (issue 17: at most 2 KiB of RSS per idle stream with 100,000 streams).

What the Python heap holds per stream, as ``tracemalloc`` attributes it, for streams of one JSON message
each: after the data directory is opened and recovered as the server does it (lazily, then in the
background), and again after every stream was appended to and read once and has gone idle. RSS adds the
allocator's own overhead to these figures; the RSS figures come from ``bench/scale_bench.py`` and
``bench/restart_bench.py`` (docs/server.md).
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from durastream_server.engine.engine import Engine
from durastream_server.storage import DataDir
from tests.server.engine.support import append, close_engine, config, create, open_engine, read

STREAMS = 2000
# Bytes of Python heap per idle stream after recovery (about 4,150 before issue 17's first pass, 1,600
# after it, about 1,280 since idle logs and states share their empty tables and rarely used slots).
RECOVERED_BOUND = 1450
# What a stream touched once keeps once idle, beyond that (main before this test: about 1,150): its new
# positions and times, plus its share of what is bounded for the whole server (512 open segment files,
# 256 read memos: about 150 bytes each over 2,000 streams, nothing at 100,000).
TOUCHED_BOUND = 400
JSON = "application/json"


def _path(i: int) -> str:
    return f"idle/s{i:05d}"


async def _populate(root: Path) -> None:
    data, engine = await open_engine(root)
    try:
        for first in range(0, STREAMS, 100):
            await asyncio.gather(
                *(
                    create(engine, _path(i), b'[{"i":%d}]' % i, content_type=JSON)
                    for i in range(first, min(STREAMS, first + 100))
                )
            )
    finally:
        await close_engine(data, engine)


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_idle_streams_take_little_memory_after_recovery_and_after_a_touch(tmp_path: Path) -> None:
    async def main() -> None:
        await _populate(tmp_path)
        tracemalloc.start()
        try:
            empty = _heap()
            data = await DataDir.open(config(tmp_path), lazy=True)
            engine = Engine(data, sweep_interval=0)
            try:
                await engine.start()
                await asyncio.wait_for(engine.recovered(), 60)
                recovered = (_heap() - empty) / STREAMS
                for i in range(STREAMS):
                    await append(engine, _path(i), b'{"j":1}', content_type=JSON)
                    result = await read(engine, _path(i), "-1", 1 << 16)
                    assert result.count == 2
                logs = list(data.logs.values())
                await _until(lambda: all(log.idle for log in logs), "logs to go idle")
                touched = (_heap() - empty) / STREAMS
            finally:
                await close_engine(data, engine)
        finally:
            tracemalloc.stop()
        assert recovered <= RECOVERED_BOUND, f"{recovered:.0f} bytes per idle stream after recovery"
        assert touched - recovered <= TOUCHED_BOUND, (
            f"{touched - recovered:.0f} more bytes per idle stream touched once ({touched:.0f} in all)"
        )

    asyncio.run(main())
