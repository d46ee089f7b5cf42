"""Storage-layer CPU of new streams' first writes, packed appends on vs off (decision 0010 step 2).

In process, no HTTP: a ``DataDir`` with fsync durability on a fresh temporary directory, ``--streams``
creates (packed: no data), then one small producer append to each (the sink's first write to a new
stream, issue 16), ``--concurrency`` at a time, then the close (its checkpoint syncs what the rounds
wrote and carries packed entries into packs). Reported per stream: the process's CPU (user + system of
every thread: the loop, the commit thread and the I/O pool; robust under load) for the appends phase
and for appends + close, and the wall time. With ``packed_appends`` off each first append promotes the
stream (mkdir, segment file, syncs at the checkpoint, catalog line); on, it is one WAL entry.

The two settings alternate ``--rounds`` times; medians and the on/off ratio are printed. The machine is
shared: quote ``uptime`` beside the figures.

Run: ``.venv/bin/python bench/packed_appends_cpu.py [--streams 2000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from durastream_server.storage import AppendEntry, DataDir, ProducerTuple, StorageConfig
from durastream_server.storage.records import StreamHeader


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def _one(streams: int, concurrency: int, packed: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="packed-bench-") as tmp:
        dd = await DataDir.open(StorageConfig(root=Path(tmp), packed_appends=packed))
        gate = asyncio.Semaphore(concurrency)

        async def create(i: int):  # noqa: ANN202
            async with gate:
                header = StreamHeader(
                    path=f"/s{i}", content_type="application/json", created_at_ms=1_700_000_000_000
                )
                return await dd.create_stream(header, None)

        logs = await asyncio.gather(*(create(i) for i in range(streams)))

        async def first_append(log) -> None:  # noqa: ANN001
            async with gate:
                payload = b'{"row":1}'
                await log.stage(
                    AppendEntry(
                        position=log.state.tail,
                        messages=(payload,),
                        timestamp_ms=1_700_000_000_001,
                        producer=ProducerTuple("sink-0-0", 0, 0),
                        digest=b"d" * 24,
                    )
                )

        cpu0, wall0 = _cpu(), time.perf_counter()
        await asyncio.gather(*(first_append(log) for log in logs))
        cpu1, wall1 = _cpu(), time.perf_counter()
        packed_left = sum(1 for log in logs if log.packed)
        await dd.close()
        cpu2 = _cpu()
        assert packed_left == (streams if packed else 0), packed_left
    return {
        "append_cpu_us": (cpu1 - cpu0) / streams * 1e6,
        "append_close_cpu_us": (cpu2 - cpu0) / streams * 1e6,
        "append_wall_us": (wall1 - wall0) / streams * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("load average before:", os.getloadavg())
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for packed in order:
            got = asyncio.run(_one(args.streams, args.concurrency, packed))
            results[packed].append(got)
            print(
                f"round {r} packed_appends={packed}: "
                + ", ".join(f"{k}={v:.0f}" for k, v in got.items())
            )
    print("load average after:", os.getloadavg())
    for key in ("append_cpu_us", "append_close_cpu_us", "append_wall_us"):
        off = statistics.median(x[key] for x in results[False])
        on = statistics.median(x[key] for x in results[True])
        print(f"{key}: off {off:.0f} us/stream, on {on:.0f} us/stream, on/off {on / off:.2f}")


if __name__ == "__main__":
    main()
