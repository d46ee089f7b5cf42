"""Storage-layer CPU of small appends to many streams (issue 17), in process, for one or more checkouts.

The storage share of ``server_bench.py --only small`` without HTTP or the engine: a ``DataDir`` with
fsync durability (packed appends on, as the server runs) on a fresh temporary directory on uvloop,
``--streams`` streams, then ``--streams`` producers, each appending one 200 B JSON message with a
producer tuple and awaiting it before the next (``StreamLog.stage``), for ``--appends`` appends per
stream. Past 256 KiB a stream is promoted out of the WAL pack, as in the server.

Reported per append: the process's CPU (user + system of every thread: the loop's staging and
settling, the commit thread's round, record encoding, the WAL write and its ``fdatasync``) and the loop
thread's own (``time.thread_time``). Checkouts (``--server-src``) alternate ``--repeat`` times, each
in a fresh process with ``PYTHONPATH=<checkout>/server``; the machine is shared, so compare ratios of
the same run. ``--profile PREFIX`` writes cProfiles of the loop thread (``PREFIX-loop.prof``) and of
the commit thread's rounds (``PREFIX-round.prof``) of the first checkout's first run.

Run: ``python bench/storage_small_cpu.py --server-src /work/main --server-src . [--repeat 4]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import asyncio, cProfile, json, os, sys, tempfile, time
from pathlib import Path
import uvloop
from durastream_server.storage import AppendEntry, DataDir, ProducerTuple, StorageConfig
from durastream_server.storage import committer as committer_mod
from durastream_server.storage.records import StreamHeader

STREAMS, APPENDS, PROFILE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
MESSAGE = b'{"pad":"' + b"x" * 190 + b'"}'

round_prof = cProfile.Profile() if PROFILE else None
if round_prof is not None:
    real = committer_mod.Committer._write_round
    def profiled(self, *args):
        round_prof.enable()
        try:
            return real(self, *args)
        finally:
            round_prof.disable()
    committer_mod.Committer._write_round = profiled

def cpu():
    t = os.times()
    return t.user + t.system

async def main():
    with tempfile.TemporaryDirectory(prefix="storage-small-") as tmp:
        dd = await DataDir.open(StorageConfig(root=Path(tmp), packed_appends=True))  # as the server
        logs = []
        for i in range(STREAMS):
            header = StreamHeader(path=f"/s{i}", content_type="application/json",
                                  created_at_ms=1_700_000_000_000)
            done, make = dd.create_packed_soon(header)  # as the engine's create (packed)
            await done
            logs.append(make(done))

        async def producer(i, log, n):
            for seq in range(n):
                await log.stage(AppendEntry(
                    position=log.state.tail, messages=(MESSAGE,), timestamp_ms=1_700_000_000_001,
                    producer=ProducerTuple(f"p{i}", 0, seq), digest=b"d" * 24))

        await asyncio.gather(*(producer(i, log, 20) for i, log in enumerate(logs)))  # warm-up
        loop_prof = cProfile.Profile() if PROFILE else None
        c0, t0, w0 = cpu(), time.thread_time(), time.perf_counter()
        if loop_prof is not None:
            loop_prof.enable()
        await asyncio.gather(*(producer(i, log, APPENDS) for i, log in enumerate(logs)))
        if loop_prof is not None:
            loop_prof.disable()
        c1, t1, w1 = cpu(), time.thread_time(), time.perf_counter()
        rounds = dd._committer.rounds
        await dd.close()
    n = STREAMS * APPENDS
    if PROFILE:
        loop_prof.dump_stats(PROFILE + "-loop.prof")
        round_prof.dump_stats(PROFILE + "-round.prof")
    print(json.dumps({"cpu_us": (c1 - c0) / n * 1e6, "loop_us": (t1 - t0) / n * 1e6,
                      "wall_us": (w1 - w0) / n * 1e6, "rounds": rounds}))

uvloop.run(main())
"""


def checkout_child(src: Path, argv: list[str]) -> dict:
    """Run ``python <argv>`` with ``src``'s server package on the path (a fresh process per figure,
    so checkouts never share imports) and return the JSON of its last output line."""
    env = {**os.environ, "PYTHONPATH": str(src / "server")}
    out = subprocess.run(
        [sys.executable, *argv], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def run(src: Path, streams: int, appends: int, profile: str) -> dict:
    return checkout_child(src, ["-c", CHILD, str(streams), str(appends), profile])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-src", type=Path, action="append", default=[])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--appends", type=int, default=400, help="per stream, counted")
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--profile", default="")
    args = parser.parse_args()
    sources = [s.resolve() for s in args.server_src] or [Path(__file__).resolve().parent.parent]
    results: dict[Path, list[dict]] = {s: [] for s in sources}
    print("load average before:", os.getloadavg())
    for r in range(args.repeat):
        for src in sources if r % 2 == 0 else sources[::-1]:
            profile = args.profile if r == 0 and src == sources[0] else ""
            got = run(src, args.streams, args.appends, profile)
            results[src].append(got)
            print(f"run {r} {src}: " + ", ".join(f"{k}={v:.1f}" for k, v in got.items()))
    print("load average after:", os.getloadavg())
    base = sources[0]
    for src in sources:
        line = ", ".join(
            f"{key} median {statistics.median(x[key] for x in results[src]):.1f}"
            for key in ("cpu_us", "loop_us", "wall_us")
        )
        if src != base:
            ratios = [
                b["cpu_us"] / a["cpu_us"] for a, b in zip(results[base], results[src], strict=True)
            ]
            line += f"; cpu ratio to {base.name} per run {[round(x, 3) for x in ratios]}"
            line += f", median {statistics.median(ratios):.3f}"
        print(f"{src}: {line}")


if __name__ == "__main__":
    main()
